"""Object detection on the host: annotations (COCO JSON, Pascal VOC XML) matched to a detector's
priors, and a synthetic reference set. The box arithmetic both sides share is
:mod:`device_agent.detection` (numpy only, shipped to boards)."""
