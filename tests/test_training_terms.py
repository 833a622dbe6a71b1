"""`TermMeans`, which every model's Trainer here uses to log loss terms beside the loss (window means over the
processes); the trainers' own tests check the logged values in real runs, torchrun included."""

import pytest
import torch

from hf_ext.trainer import TermMeans


class SumOverTwoProcesses:
    """An accelerator stand-in whose reduction adds a second process's totals (fixed) to this one's."""

    def __init__(self, other):
        self.other = other

    def reduce(self, tensor, reduction):
        assert reduction == "sum"
        return tensor + self.other


def test_means_of_each_window_then_start_again():
    terms = TermMeans(["loss_a", "loss_b", "beta"], "cpu")
    single = SumOverTwoProcesses(torch.zeros_like(terms.totals))
    for value in (1.0, 2.0, 6.0):
        terms.add("loss_a", torch.tensor(value))
    terms.add("beta", torch.tensor(0.25))
    assert terms.means(single) == {"loss_a": 3.0, "beta": 0.25}  # loss_b never added: left out
    assert terms.means(single) == {}
    terms.add("loss_b", torch.tensor([2.0, 4.0, 9.0]).sum(), count=3)
    assert terms.means(single) == {"loss_b": 5.0}


def test_means_pool_the_processes_by_count():
    terms = TermMeans(["loss_a", "loss_b"], "cpu")
    other = torch.tensor([[10.0, 0.0], [2.0, 0.0]], dtype=terms.totals.dtype)  # the other process: loss_a 4 + 6
    terms.add("loss_a", torch.tensor(1.0))
    terms.add("loss_b", torch.tensor(7.0))
    assert terms.means(SumOverTwoProcesses(other)) == {"loss_a": pytest.approx(11 / 3), "loss_b": 7.0}


def test_unknown_term_is_refused():
    with pytest.raises(KeyError):
        TermMeans(["loss_a"], "cpu").add("loss_c", torch.tensor(1.0))
