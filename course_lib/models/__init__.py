"""Models built from the kernels: CoLT5's routed block (``routed``) and chapter 7's
recall task (``recall_task``)."""

from .recall_task import RecallModel, RecallTask, recall_batch, train_recall
from .routed import CoordinateDescentRouter, RoutedBlock, top_k_routing

__all__ = ["RoutedBlock", "CoordinateDescentRouter", "top_k_routing", "RecallTask", "RecallModel", "recall_batch",
           "train_recall"]
