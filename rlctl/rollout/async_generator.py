"""One generator engine of asynchronous RL (rl.async_rollout): a spawned process with its own torch threads or its
own GPUs that samples its share of every round with the newest weights pushed (`rlctl.rollout.async_engine` is the
trainer's side).

The process connects to the trainer's main process first (so a failure while it builds is reported, not lost),
joins the push group, and takes in every push in a thread of its own (`weight_push.Receiver`). Its engine is a
transformers copy of the policy (log-probs from the trainer's own forward pass) or, with rl.use_vllm, a vLLM engine
(`rlctl.rollout.vllm.dedicated`, log-probs from vLLM; each load is checked on the probe text, issue 18's sync check
on every push). Before a share it loads the newest push (waiting for the round's `min_version`), samples with the
share's seed, scores what it sampled and sends it back with the version and a fingerprint of the weights it holds.
A failure is printed in full on its stderr (the run's log) and sent to the trainer as a `Failure`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
import traceback
from collections import deque
from typing import Any

import torch

from rlctl import processes
from rlctl.rollout import multiturn, weight_push
from rlctl.rollout.async_engine import (
    CLOSE_S,
    Done,
    Failure,
    GeneratorSetup,
    Link,
    Round,
    Tally,
    connect,
    fingerprint,
    hostname,
    receive,
    send,
)
from rlctl.rollout.samples import Sample, collate, token_logprobs

SHARE_SEED = 1_000_003  # a share's seed: the run's seed + the round's first prompt + SHARE_SEED x its share


def serve(setup: GeneratorSetup, link: Link) -> None:
    """The engine process: sample every share it is sent until it gets None. It ends with os._exit, never while
    its push thread still waits in the group (a thread blocked in gloo would abort the interpreter's exit)."""
    processes.die_with_parent()
    if setup.visible_gpus is not None:  # the trainer's processes see only their GPUs; this one only its own
        os.environ["CUDA_VISIBLE_DEVICES"] = setup.visible_gpus
    os.environ.update(setup.env or {})
    for signum in (signal.SIGINT, signal.SIGTERM):  # a stop reaches the whole group: the trainer saves, then ends
        signal.signal(signum, signal.SIG_IGN)  # this process (a trainer killed outright takes it along)
    conn = connect(link, setup.index, setup.node)
    held: list[weight_push.Receiver] = []
    code = 0
    try:
        with tempfile.TemporaryDirectory(prefix="rlctl-generator-") as folder:
            _serve(setup, link, conn, folder, held)
    except (EOFError, ConnectionError):  # the trainer went away: its own error says why
        pass
    except Exception as e:
        code = 1
        text = traceback.format_exc()
        print(f"rlctl: async generator engine {setup.index} failed:\n{text}", file=sys.stderr, flush=True)
        frames = traceback.extract_tb(e.__traceback__)
        where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno} ({frames[-1].name})" if frames else "?"
        with contextlib.suppress(OSError, EOFError):
            send(conn, Failure(type(e).__name__, str(e), where, text))
            while receive(conn) is not None:  # until the trainer, told, ends the engines
                pass
    finally:
        for pushes in held:
            pushes.join(CLOSE_S)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve(setup: GeneratorSetup, link: Link, conn: Any, folder: str, held: list) -> None:
    torch.set_num_threads(setup.threads)
    layout = receive(conn)
    world = link.engines + 1
    at = weight_push.store(link.host, link.store_port, world)
    pushes = weight_push.Receiver(weight_push.group(at, setup.index + 1, world), layout)
    held.append(pushes)
    agent = multiturn.agent_for(setup.rl, setup.tokenizer)
    stops = agent.stop_ids if agent else ()
    side = _VLLM(setup, folder, stops) if setup.llm_args is not None else _Transformers(setup, pushes.buffers, stops)
    tally = Tally(setup.index, setup.node, hostname(), os.getpid(), side.name)
    loaded, mark, gap = -1, [], None
    pending: deque[Round | None] = deque()
    while (share := _next(conn, pending)) is not None:
        start = time.perf_counter()
        pushes.wait_for(share.min_version)
        with pushes.lock:
            if pushes.version != loaded:
                mark, gap = side.load(pushes)
                loaded = pushes.version
                tally.loaded.append(loaded)
        side.sample(agent, share.samples, setup.seed + share.key + SHARE_SEED * share.share)
        tally.rounds, tally.rollouts = tally.rounds + 1, tally.rollouts + len(share.samples)
        seconds = time.perf_counter() - start
        done = Done(share.key, share.share, share.samples, loaded, mark, seconds, gap, side.name, pushes.pushes)
        send(conn, done)
    pushes.join(CLOSE_S)
    tally.pushes = pushes.pushes
    send(conn, tally)


def _next(conn: Any, pending: deque) -> Round | None:
    """The next share to sample, None once the trainer said to end (shares queued behind its end are dropped)."""
    while conn.poll(0) or not pending:
        pending.append(receive(conn))
    return None if None in pending else pending.popleft()


class _Transformers:
    """A transformers copy of the policy: samples, then scores what it sampled with the trainer's forward pass."""

    name = "transformers"

    def __init__(self, setup: GeneratorSetup, buffers: dict[str, torch.Tensor], stops: tuple):
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        from rlctl.rollout.generate import HFGenerator
        from rlctl.rollout.vision import is_vision_model

        self.setup, rl = setup, setup.rl
        dtype = next(iter(buffers.values())).dtype
        auto = AutoModelForImageTextToText if is_vision_model(setup.model_config) else AutoModelForCausalLM
        self.model = auto.from_config(setup.model_config, torch_dtype=dtype).to(setup.device).eval()
        self.engine = HFGenerator(setup.tokenizer, rl.max_new_tokens, rl.temperature, setup.batch_size, stop_ids=stops)
        self.engine.sync(self.model)

    def load(self, pushed: weight_push.Receiver) -> tuple[list[float], None]:
        """Take the pushed weights; the fingerprint of what the model now holds."""
        self.model.load_state_dict(pushed.buffers, strict=False)  # a tied head comes once; tie_weights keeps it tied
        self.model.tie_weights()
        return fingerprint((n, p) for n, p in self.model.state_dict().items() if n in pushed.buffers), None

    def sample(self, agent: Any, samples: list[Sample], seed: int) -> None:
        setup, tok = self.setup, self.setup.tokenizer
        torch.manual_seed(seed)
        multiturn.sample(agent, self.engine, samples, tok.eos_token_id)
        with torch.no_grad():
            for i in range(0, len(samples), setup.batch_size):
                part = samples[i : i + setup.batch_size]
                lps = token_logprobs(self.model, collate(part, tok.pad_token_id, setup.device), setup.rl.temperature)
                for s, row in zip(part, lps.cpu().tolist(), strict=True):
                    s.rollout_logprobs = row[: len(s.completion_ids)]


class _VLLM:
    """A vLLM engine of the generator's own: samples with its log-probs; each load is checked on the probe text."""

    name = "vllm"

    def __init__(self, setup: GeneratorSetup, folder: str, stops: tuple):
        from rlctl.rollout import vllm

        setup.model_config.save_pretrained(folder)  # what vLLM builds its engine from; the weights come by push
        setup.tokenizer.save_pretrained(folder)
        self.setup = setup
        args = {**(setup.llm_args or {}), "model": folder}
        self.engine = vllm.dedicated(args, setup.tokenizer, setup.rl, stops)

    def load(self, pushed: weight_push.Receiver) -> tuple[list[float], tuple[float, float]]:
        """Take the pushed weights; their fingerprint and the probe's |log-prob difference| (mean, max)."""
        self.engine.load(pushed.buffers.items())
        probe = (self.setup.probe or [])[: (self.setup.llm_args or {})["max_model_len"] - 1]  # what the engine holds
        got = torch.tensor(self.engine.probe_logprobs(probe), dtype=torch.float64)
        diff = (got - pushed.probe[: len(got)]).abs()
        return fingerprint(pushed.buffers.items()), (float(diff.mean()), float(diff.max()))

    def sample(self, agent: Any, samples: list[Sample], seed: int) -> None:
        self.engine.seed(seed)
        multiturn.sample(agent, self.engine, samples, self.setup.tokenizer.eos_token_id)
