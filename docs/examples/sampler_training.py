"""A plain torch training loop fed by hydraplan's workload-balanced sampler (CPU, a tiny model).

    pip install -e ".[runtime]" && python docs/examples/sampler_training.py

Two data-parallel ranks are simulated in one process: each step, every rank runs its micro-batches
(packed sequences, no attention across them: here a model without attention at all, so packing is
just concatenation), the gradients of both ranks are summed, the loss is normalised over every
token of the step, and one optimizer step follows, as a real data-parallel run would do.
"""

from __future__ import annotations

import torch

from hydraplan.integrations.torch import WorkloadBalancedSampler

VOCAB, WIDTH, DP_SIZE = 64, 32, 2


def dataset(num_samples: int, seed: int = 0) -> list[torch.Tensor]:
    """Random token sequences of uneven lengths (a stand-in for a tokenised corpus)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 400, (num_samples,), generator=generator).tolist()
    return [torch.randint(0, VOCAB, (length,), generator=generator) for length in lengths]


def main(num_steps: int = 3) -> list[float]:
    samples = dataset(400)
    sampler = WorkloadBalancedSampler(
        [len(sample) for sample in samples],
        dp_size=DP_SIZE,
        scheme="<1,1,1>",
        tokens_per_step=20_000,
        model="tiny",
        gpu="h100-sxm-80gb",
        seed=0,
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH), torch.nn.Linear(WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for batches in sampler.steps(0, num_steps):
        optimizer.zero_grad()
        step_tokens = sum(len(samples[i]) - 1 for rank in batches.ranks for micro in rank for i in micro)
        step_loss = 0.0
        for rank in range(DP_SIZE):  # each rank's micro-batches, in the order the plan gives
            for micro_batch in batches.ranks[rank]:
                inputs = torch.cat([samples[i][:-1] for i in micro_batch])
                targets = torch.cat([samples[i][1:] for i in micro_batch])
                loss = torch.nn.functional.cross_entropy(model(inputs), targets, reduction="sum") / step_tokens
                loss.backward()  # gradients accumulate: the sum over ranks and micro-batches
                step_loss += float(loss.detach())
        optimizer.step()
        losses.append(step_loss)
        counts = [len(rank) for rank in batches.ranks]
        print(f"step {batches.step}: loss {step_loss:.4f}, micro-batches per rank {counts}")
    return losses


if __name__ == "__main__":
    main()
