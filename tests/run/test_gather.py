"""lightning_ig.run.gather: one collective for a result's rows and the rows that ride along."""

from __future__ import annotations

import torch

from lightning_ig.run.gather import JointGather


def test_one_call_carries_the_result_and_every_rider_and_splits_them_again() -> None:
    calls: list[torch.Size] = []
    other_rank = (torch.full((2, 3), 7.0), torch.full((2, 1), 8.0), torch.full((2, 2), 9, dtype=torch.int64))

    def all_gather(joint: torch.Tensor) -> torch.Tensor:  # two ranks: this one's rows, then the other's
        calls.append(joint.shape)
        return torch.stack([joint, torch.cat([other_rank[0], other_rank[1], other_rank[2].to(joint.dtype)], dim=1)])

    packed = torch.arange(6.0).reshape(2, 3)
    riders = [torch.tensor([[1.0], [2.0]]), torch.tensor([[3, 4], [5, 6]])]
    gather = JointGather(all_gather, riders)
    main = gather(packed)
    assert calls == [torch.Size([2, 6])]  # one collective, every column in it
    assert torch.equal(main, torch.cat([packed, other_rank[0]]))  # rank-major: state order
    assert torch.equal(gather.riders[0], torch.tensor([[1.0], [2.0], [8.0], [8.0]]))
    assert torch.equal(gather.riders[1], torch.tensor([[3.0, 4.0], [5.0, 6.0], [9.0, 9.0], [9.0, 9.0]]))


def test_without_a_collective_nothing_moves() -> None:
    packed, rider = torch.ones(2, 3), torch.zeros(2, 1)
    gather = JointGather(None, [rider])
    assert gather(packed) is packed and gather.riders[0] is rider
    assert JointGather(lambda rows: rows[None], [])(packed).shape == (1, 2, 3)  # no riders: the call as it is
