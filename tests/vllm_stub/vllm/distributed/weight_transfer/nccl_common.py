"""Server-mode weight transfer (imported by TRL's vLLM client, never used in colocate mode)."""


def trainer_init(*args, **kwargs):
    raise NotImplementedError("the vLLM stand-in has no server mode")
