"""SSD-Lite MobileNetV2 with its multibox loss written as the STM32 wiki's training script writes it.

The network is :class:`ssdlite.SSDLite` (the same heads and priors, so the shapes sets of
``datasets:shapes_detection*`` match it); the loss is the wiki's style of multibox loss, called in
``forward`` by a wrapper holding the network and the criterion, unlike :func:`ssdlite.multibox_loss`:

* the hard-negative mining runs under ``no_grad`` on the background loss, writes ``-inf`` into the
  positives' entries by boolean indexing and ranks by a sort of the sort's indices;
* the classification loss is the cross-entropy of the rows a boolean mask selects
  (``confidence[mask, :]``, ``labels[mask]``), the regression loss the Smooth-L1 of the positive
  rows, both summed and divided by the number of positive rows the mask selected.

Only the two changes a current PyTorch needs (labels are int64 and go to ``cross_entropy`` uncast),
and the one the export needs: Smooth-L1 written out. A batch without any positive prior divides by
0, as the wiki's loss does.
"""

from __future__ import annotations

import math

import torch
from ssdlite import SSDLite
from torch import nn
from torch.nn import functional as F

NEG_POS_RATIO = 3


def mine_hard_negatives(background: torch.Tensor, labels: torch.Tensor, ratio: int) -> torch.Tensor:
    """The priors the classification loss keeps: every positive and, per image, the ``ratio`` times
    as many negatives whose background loss is highest."""
    positives = labels > 0
    wanted = positives.long().sum(dim=1, keepdim=True) * ratio
    background[positives] = -math.inf  # a positive is never chosen as a negative
    _, by_loss = background.sort(dim=1, descending=True)
    _, rank = by_loss.sort(dim=1)
    return positives | (rank < wanted)


def smooth_l1_sum(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``F.smooth_l1_loss(predicted, target, reduction="sum")`` written out (the TorchScript
    exporter has no ``smooth_l1_loss``)."""
    diff = torch.abs(predicted - target)
    return torch.where(diff < 1.0, 0.5 * diff * diff, diff - 0.5).sum()


class MultiboxLoss(nn.Module):
    """Smooth-L1 over the positive priors' offsets and cross-entropy over the mined priors, each
    summed and divided by the number of positives: ``(regression, classification)``."""

    def __init__(self, neg_pos_ratio: int = NEG_POS_RATIO) -> None:
        super().__init__()
        self.neg_pos_ratio = neg_pos_ratio

    def forward(
        self,
        confidence: torch.Tensor,
        locations: torch.Tensor,
        labels: torch.Tensor,
        gt_locations: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        classes = confidence.size(2)
        with torch.no_grad():
            background = -F.log_softmax(confidence, dim=2)[:, :, 0]
            kept = mine_hard_negatives(background, labels, self.neg_pos_ratio)
        chosen = confidence[kept, :]
        classification = F.cross_entropy(chosen.reshape(-1, classes), labels[kept], reduction="sum")
        positives = labels > 0
        predicted = locations[positives, :].reshape(-1, 4)
        target = gt_locations[positives, :].reshape(-1, 4)
        regression = smooth_l1_sum(predicted, target)
        count = target.size(0)
        return regression / count, classification / count


class WikiSSD(nn.Module):
    """The network and its criterion, the loss computed in ``forward``:
    ``(images, labels, gt_offsets) -> (loss, scores, offsets)`` as :class:`ssdlite.SSDLite`."""

    def __init__(self, num_classes: int, size: int, width: float) -> None:
        super().__init__()
        self.net = SSDLite(num_classes, size, width)
        self.criterion = MultiboxLoss()

    def priors(self):
        """The network's center-form priors (what the recipe's detection section decodes with)."""
        return self.net.priors()

    def forward(
        self, images: torch.Tensor, labels: torch.Tensor, gt_offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        confidence, locations = self.net.heads(images)
        regression, classification = self.criterion(confidence, locations, labels, gt_offsets)
        return regression + classification, torch.softmax(confidence, -1), locations


def ssdlite_wiki(num_classes: int = 3, size: int = 300, width: float = 1.0) -> WikiSSD:
    """The recipe's ``model.callable``."""
    return WikiSSD(num_classes, size, width)
