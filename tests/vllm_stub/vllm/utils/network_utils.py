"""vllm.utils.network_utils as TRL's server-mode client imports it."""


def get_ip() -> str:
    return "127.0.0.1"
