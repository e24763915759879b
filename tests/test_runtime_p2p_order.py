"""The pipeline's point-to-point order is NCCL-safe: every 1F1B schedule of up to 8 stages and 12
micro-batches completes under NCCL's semantics (`runtime.p2p_order`), and the checker does fail
on the patterns NCCL blocks on (no torch needed: the order is plain data)."""

from __future__ import annotations

import pytest

from hydraplan.runtime.assignment import one_f_one_b
from hydraplan.runtime.p2p_order import find_nccl_deadlock, stage_exchanges, trace_of_exchanges


def pipeline_traces(num_stages: int, num_micro_batches: int) -> dict:
    ranks = {stage: stage for stage in range(num_stages)}
    return {
        stage: trace_of_exchanges(stage_exchanges(stage, num_stages, num_micro_batches), ranks, stage)
        for stage in range(num_stages)
    }


@pytest.mark.parametrize("num_stages", range(1, 9))
def test_every_1f1b_schedule_completes_under_nccl_semantics(num_stages):
    for num_micro_batches in range(1, 13):
        assert find_nccl_deadlock(pipeline_traces(num_stages, num_micro_batches)) is None


def test_each_exchange_pairs_the_previous_output_with_the_next_input():
    # stage 0 of 2, 3 micro-batches: F0 F1 B0 F2 B1 B2 (ops 0..5); B0 and B1 need the next
    # stage's gradient, which comes with the activation of the forward before them going out
    assert one_f_one_b(0, 2, 3) == [(True, 0), (True, 1), (False, 0), (True, 2), (False, 1), (False, 2)]
    exchanges = stage_exchanges(0, 2, 3)
    assert [(e.before_op, e.sends, e.recvs) for e in exchanges] == [
        (1, ((+1, 0),), ()),
        (2, ((+1, 1),), ((+1, 0),)),
        (4, ((+1, 2),), ((+1, 1),)),
        (5, (), ((+1, 2),)),
    ]


def unbatched_traces(num_stages: int, num_micro_batches: int) -> dict:
    """The former order: a send posted alone (`isend`), a receive alone (`recv`)."""
    traces = {}
    for stage in range(num_stages):
        batches = []
        for is_forward, index in one_f_one_b(stage, num_stages, num_micro_batches):
            if is_forward:
                batches += [[("recv", stage - 1, 2 * index)]] if stage > 0 else []
                batches += [[("send", stage + 1, 2 * index)]] if stage < num_stages - 1 else []
            else:
                batches += [[("recv", stage + 1, 2 * index + 1)]] if stage < num_stages - 1 else []
                batches += [[("send", stage - 1, 2 * index + 1)]] if stage > 0 else []
        traces[stage] = batches
    return traces


def test_the_checker_finds_a_send_and_a_receive_posted_apart_in_opposite_directions():
    problem = find_nccl_deadlock(unbatched_traces(2, 4))
    assert problem is not None and problem.startswith("rank 0 waits for ever in its batch 1 [('send', 1, 2)]")


def test_the_checker_finds_messages_matched_out_of_order():
    traces = {0: [[("send", 1, 0)], [("send", 1, 2)]], 1: [[("recv", 0, 2)], [("recv", 0, 0)]]}
    problem = find_nccl_deadlock(traces)
    assert problem == (
        "message 0 from rank 0 to rank 1 is tag 0 but the receive posted for it expects tag 2 "
        "(NCCL matches by order, not by tag)"
    )


def test_a_stage_with_only_warm_up_forwards_sends_its_last_activation_before_it_waits_for_a_gradient():
    # pp 2, one micro-batch: stage 1 needs activation 0 to make gradient 0, so stage 0 may not wait
    # for that gradient's header in the batch that posts the activation's header (the payload
    # goes out only after that batch): it hung `hydraplan run` on a one-micro-batch pipeline
    exchanges = stage_exchanges(0, 2, 1)
    assert [(e.before_op, e.sends, e.recvs) for e in exchanges] == [(1, ((+1, 0),), ()), (1, (), ((+1, 0),))]
    paired = {0: [[("send", 1, 0), ("recv", 1, 2)], [("send", 1, 1), ("recv", 1, 3)]], 1: pipeline_traces(2, 1)[1]}
    assert find_nccl_deadlock(paired) is not None
    assert find_nccl_deadlock(pipeline_traces(2, 1)) is None
