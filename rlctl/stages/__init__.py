"""Training stages, run inside `accelerate launch` by rlctl.runner. These modules import torch."""
