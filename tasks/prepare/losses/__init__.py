"""The losses of the task recipes beyond classification: distillation, segmentation (per-pixel
cross-entropy, soft Dice) and keypoints (heatmap or coordinate MSE): the checks of the model's output
both runtimes share, and the onnxblock Blocks of the ORT-training runtime (over ``block_ops``).
"""
