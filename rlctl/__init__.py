"""rlctl: CLI-first post-training for LLMs (SFT -> reward model -> RL).

Importing this package must stay cheap: no torch, transformers or trl at import time.
"""

__version__ = "0.1.0"
