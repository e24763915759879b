"""Which point-to-point messages a pipeline stage posts together, and a checker of NCCL's semantics.

NCCL runs the point-to-point operations of one communicator in the order they are posted, and a
send may not complete before its receiver posts the matching receive (large messages rendezvous).
Two stages that each post a send to the other and then, separately, a receive from the other can
therefore wait for ever. Megatron-LM avoids it by posting the send of one op's output together
with the receive of the next op's input (`send_forward_recv_backward`, `send_backward_recv_forward`
in `megatron/core/pipeline_parallel/p2p_communication.py`): a batch of `torch.distributed.P2POp`
given to `batch_isend_irecv` is one NCCL group, whose operations progress together.

- `stage_exchanges(stage, pp, m)`: that rule on the 1F1B order of `assignment.one_f_one_b`: before
  op t, one exchange holding op t-1's outgoing message and op t's incoming one (either may be
  absent); after the last op, its outgoing message alone. One exception, Megatron-LM's too: a stage
  whose forwards are all warm-up (m <= pp - stage - 1) sends its last activation alone, then
  receives its first gradient alone; the next stage needs that activation to make that gradient,
  and pairs them in no exchange of its own. `pipeline_exec` executes exactly this list.
- `trace_of_exchanges`: the batches a stage posts for its exchanges, as `pipeline_exec` posts them:
  per exchange, the shape headers of its messages in one batch, then their payloads in another
  (a payload's receive buffer is allocated from its header).
- `find_nccl_deadlock(traces)`: replays per-rank traces of batches (what every rank posted, in
  order: `("send"|"recv", peer, tag)` per message) under the strictest reading of NCCL: a rank's
  batches run one after another; a batch completes once every message in it is matched; messages
  between two ranks match in posting order (NCCL has no tags), and a matched pair must agree on
  the tag. Returns None when every batch completes, else one line naming a rank that waits for
  ever and what it waits for. Plain Python: tests run it on every schedule they execute.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hydraplan.runtime.assignment import one_f_one_b

__all__ = ["Exchange", "Message", "find_nccl_deadlock", "stage_exchanges", "trace_of_exchanges"]

Message = tuple[str, int, int]  # ("send" | "recv", peer rank, tag)


@dataclass(frozen=True)
class Exchange:
    """Messages posted together before op `before_op` (len(order): after the last op). `send`/`recv`:
    (direction, micro-batch) with direction +1 to/from the next stage, -1 the previous one."""

    before_op: int  # two exchanges may share it: they run in list order
    sends: tuple[tuple[int, int], ...]
    recvs: tuple[tuple[int, int], ...]


def forward_tag(micro_batch: int) -> int:
    return 2 * micro_batch


def backward_tag(micro_batch: int) -> int:
    return 2 * micro_batch + 1


def stage_exchanges(stage: int, num_stages: int, num_micro_batches: int) -> list[Exchange]:
    """The exchanges of one stage under 1F1B (see the module); empty ones are left out."""
    order = one_f_one_b(stage, num_stages, num_micro_batches)
    first, last = stage == 0, stage == num_stages - 1

    def outgoing(is_forward: bool, index: int) -> tuple[tuple[int, int], ...]:
        if is_forward:
            return () if last else ((+1, index),)
        return () if first else ((-1, index),)

    def incoming(is_forward: bool, index: int) -> tuple[tuple[int, int], ...]:
        if is_forward:
            return () if first else ((-1, index),)
        return () if last else ((+1, index),)

    # all forwards are warm-up: the first backward follows the last forward with no steady state
    all_warm_up = num_micro_batches <= num_stages - stage - 1
    exchanges = []
    for position in range(len(order) + 1):
        sends = outgoing(*order[position - 1]) if position > 0 else ()
        recvs = incoming(*order[position]) if position < len(order) else ()
        if all_warm_up and sends and recvs and order[position - 1][0] and not order[position][0]:
            exchanges += [Exchange(position, sends, ()), Exchange(position, (), recvs)]
        elif sends or recvs:
            exchanges.append(Exchange(position, sends, recvs))
    return exchanges


def tag_of(is_forward_message: bool, micro_batch: int) -> int:
    return forward_tag(micro_batch) if is_forward_message else backward_tag(micro_batch)


def trace_of_exchanges(exchanges: list[Exchange], rank_of_stage: dict[int, int], stage: int) -> list[list[Message]]:
    """The batches a stage posts, with peers as ranks and tags as `pipeline_exec` gives them: per
    exchange, its messages' headers (tag 2t), then their payloads (2t + 1), t the message's tag
    (a message to the next stage is an activation, to the previous one a gradient)."""
    batches = []
    for exchange in exchanges:
        messages = [("send", rank_of_stage[stage + d], tag_of(d > 0, index)) for d, index in exchange.sends]
        messages += [("recv", rank_of_stage[stage + d], tag_of(d < 0, index)) for d, index in exchange.recvs]
        for part in (0, 1):  # the headers, then the payloads
            batches.append([(kind, peer, 2 * tag + part) for kind, peer, tag in messages])
    return batches


def find_nccl_deadlock(traces: dict[int, list[list[Message]]]) -> str | None:
    """None when every rank's batches complete under NCCL's semantics (see the module), else one line."""
    position = {rank: 0 for rank in traces}
    # per (sender, receiver): the tags of the sends and of the receives posted so far, in order
    posted: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    done: dict[tuple[str, int, int], int] = defaultdict(int)
    for rank in traces:
        _post(traces, rank, 0, posted)
    progressed = True
    while progressed:
        progressed = False
        for rank, batches in traces.items():
            index = position[rank]
            if index >= len(batches):
                continue
            problem = _tag_mismatch(posted)
            if problem is not None:
                return problem
            if all(_matched(rank, message, batches[index], posted, done) for message in batches[index]):
                for kind, peer, _ in batches[index]:
                    done[_stream(rank, kind, peer)] += 1
                position[rank] = index + 1
                _post(traces, rank, index + 1, posted)
                progressed = True
    stuck = [rank for rank in traces if position[rank] < len(traces[rank])]
    if not stuck:
        return _tag_mismatch(posted)
    rank = stuck[0]
    batch = traces[rank][position[rank]]
    return (
        f"rank {rank} waits for ever in its batch {position[rank]} {batch}: every rank "
        f"{stuck} is blocked in a batch whose peers have not posted the matching message"
    )


def _stream(rank: int, kind: str, peer: int) -> tuple[str, int, int]:
    """The ordered message stream a message belongs to: (kind, sender, receiver)."""
    return ("send", rank, peer) if kind == "send" else ("recv", peer, rank)


def _post(traces, rank: int, index: int, posted) -> None:
    if index < len(traces[rank]):
        for kind, peer, tag in traces[rank][index]:
            posted[_stream(rank, kind, peer)].append(tag)


def _matched(rank: int, message: Message, batch: list[Message], posted, done) -> bool:
    """The message's counterpart is posted: its position in its stream is below the peer's count."""
    kind, peer, _ = message
    stream = _stream(rank, kind, peer)
    same_before = sum(1 for other in batch[: batch.index(message)] if _stream(rank, other[0], other[1]) == stream)
    position = done[stream] + same_before
    counterpart = ("recv" if kind == "send" else "send", stream[1], stream[2])
    return position < len(posted[counterpart])


def _tag_mismatch(posted) -> str | None:
    for (kind, sender, receiver), tags in posted.items():
        if kind != "send":
            continue
        receives = posted.get(("recv", sender, receiver), [])
        for index, (sent, received) in enumerate(zip(tags, receives)):
            if sent != received:
                return (
                    f"message {index} from rank {sender} to rank {receiver} is tag {sent} but the receive "
                    f"posted for it expects tag {received} (NCCL matches by order, not by tag)"
                )
    return None
