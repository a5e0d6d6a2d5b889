"""Agentic RL: the tools (calculator, sandboxed python, user files), tool-call parsing, the chat template's tool
turns, multi-turn rollouts (turns, budget, errors counted) and the loss mask that keeps tool results out of the
gradient."""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

import pytest

from rlctl.errors import UserError
from rlctl.rollout import multiturn, toolcalls, tools

PLAIN_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    from rlctl.stages.tiny import train_tokenizer

    corpus = [f"{a} * {b} = {a * b} <tool_call> calculator expression" for a in range(40) for b in range(40)]
    return train_tokenizer(corpus, 300)


# ------------------------------------------------------------------------------------------------ tools
@pytest.mark.parametrize(
    ("expression", "value"),
    [("123*456", "56088"), ("(2 + 3) * -4", "-20"), ("1/3 + 1/6", "0.5"), ("1/3 + 1/3", "2/3"), ("7/4", "1.75"),
     ("0.1 + 0.2", "0.3"), ("2**-2", "0.25"), ("17 // 5 + 17 % 5", "5"), ("1/3", "1/3"), ("-1.25*2", "-2.5")],
)  # fmt: skip
def test_calculator_is_exact(expression, value):
    assert tools.calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [("__import__('os').system('true')", "not arithmetic"), ("x + 1", "not arithmetic"), ("9**9**9", "exponents"),
     ("2**0.5", "exponents"), ("10**200 * 10**250", "digits"), ("1/0", "division by zero"), ("1 +", "cannot read"),
     ("1" * 500, "longer")],
)  # fmt: skip
def test_calculator_refuses_code_and_huge_numbers(expression, why):
    with pytest.raises((ValueError, ZeroDivisionError), match=why):
        tools.calculator(expression)


def test_python_tool_runs_in_the_sandbox():
    found = tools.resolve_all(["python"])
    assert tools.call(found, "python", {"code": "print(6 * 7)"}) == tools.ToolResult("42\n", False)
    refused = tools.call(found, "python", {"code": "import socket; socket.create_connection(('1.1.1.1', 80))"})
    assert refused.error and "Network is unreachable" in refused.text
    raised = tools.call(found, "python", {"code": "raise KeyError('k')"})
    assert raised.error and "KeyError" in raised.text


def test_python_tool_time_limit():
    slow = tools.call(tools.resolve_all(["python"]), "python", {"code": "while True: pass"})
    assert slow.error and "timeout" in slow.text


def _tool_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "my_tools.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_user_tool_schema_from_signature_and_docstring(tmp_path):
    path = _tool_file(
        tmp_path,
        '''
        from typing import Literal

        def lookup(city: str, days: int = 1, unit: Literal["c", "f"] = "c") -> str:
            """Weather forecast for a city.

            Args:
                city: the city's name.
                days: how many days ahead,
                    counted from today.
            """
            return f"{city}: sunny for {days} days"
        ''',
    )
    tool = tools.resolve(f"{path}:lookup")
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "the city's name."},
                    "days": {"type": "integer", "description": "how many days ahead, counted from today."},
                    "unit": {"enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    }
    assert tools.call({"lookup": tool}, "lookup", {"city": "Oslo", "days": 2}).text == "Oslo: sunny for 2 days"


@pytest.mark.parametrize(
    ("spec", "body", "message"),
    [("calculater", None, "Did you mean: calculator"), ("missing.py:f", None, "not found"),
     ("FILE:f", "import not_a_module_here\n", "failed to import"), ("FILE:lokup", "def lookup(x):\n    'Doc.'\n",
     "Did you mean: lookup"), ("FILE:bare", "def bare(x):\n    return x\n", "no docstring")],
)  # fmt: skip
def test_bad_tool_specs_are_user_errors(tmp_path, spec, body, message):
    if body is not None:
        spec = spec.replace("FILE", str(_tool_file(tmp_path, body)))
    with pytest.raises(UserError, match=message):
        tools.resolve_all([spec])


def test_a_failing_tool_answers_with_an_error(tmp_path):
    path = _tool_file(
        tmp_path,
        '''
        import time

        def boom(x: int) -> str:
            """Always fails."""
            raise RuntimeError(f"broken on {x}")

        def nap(seconds: float) -> str:
            """Sleeps."""
            time.sleep(seconds)
            return "rested"
        ''',
    )
    found = tools.resolve_all([f"{path}:boom", f"{path}:nap"])
    assert tools.call(found, "boom", {"x": 3}) == tools.ToolResult("Error: RuntimeError: broken on 3", True)
    late = tools.call(found, "nap", {"seconds": 5}, timeout_s=0.2)
    assert late.error and "longer than 0.2 s" in late.text
    assert tools.call(found, "nap", {"seconds": 0}, timeout_s=0.2) == tools.ToolResult("rested", False)
    assert tools.call(found, "boom", {"y": 1}).error
    assert "unknown tool 'bom'" in tools.call(found, "bom", {}).text


# ------------------------------------------------------------------------------------------------ parsing
def test_parse_tool_calls():
    text = (
        'Let me compute.<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*13"}}\n</tool_call>'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
    )
    assert toolcalls.parse(text) == [
        toolcalls.ToolCall("calculator", {"expression": "12*13"}),
        toolcalls.ToolCall("python", {"code": "print(1)"}),
    ]
    assert toolcalls.parse("The answer is 156.") == []


@pytest.mark.parametrize(
    ("text", "why"),
    [("<tool_call>{name: calculator}</tool_call>", "not valid JSON"), ('<tool_call>["calculator"]</tool_call>',
     "JSON object"), ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "must be a JSON object"),
     ('<tool_call>{"name": "calculator", "arguments": {}}', "not closed")],
)  # fmt: skip
def test_malformed_tool_calls_carry_their_error(text, why):
    (call,) = toolcalls.parse(text)
    assert call.error and why in call.error


def test_chatml_renders_tools_and_tool_results(tok):
    plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    plain.append({"role": "assistant", "content": "yo"})
    new = tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    assert new == tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, chat_template=PLAIN_CHATML)
    schema = tools.resolve("calculator").schema
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "12*13?"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "calculator", "arguments": {"expression": "12*13"}}}]}]  # fmt: skip
    text = tok.apply_chat_template(messages, tools=[schema], tokenize=False)
    assert text.startswith("<|im_start|>system\nBe exact.\n\n# Tools\n")
    assert '"name": "calculator"' in text and text.count("<|im_start|>system") == 1
    assert text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": '
                         '{"expression": "12*13"}}\n</tool_call><|im_end|>\n')  # fmt: skip
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<tool_call>{}</tool_call>"}]
    follow = toolcalls.result_text(tok, turn, ["156", "Error: x"], [schema], "<|im_end|>")
    assert follow == (
        "\n<|im_start|>user\n<tool_response>\n156\n</tool_response>\n<tool_response>\nError: x\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


# ------------------------------------------------------------------------------------------- multi-turn
class Scripted:
    """An engine that writes the given turns (the policy under test is the rollout logic, not the sampling);
    it records the token ids it was asked to continue."""

    logprobs = None

    def __init__(self, tok, turns: list[list[str]]):
        self.tok, self.turns, self.seen = tok, turns, []

    def awake(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def generate(self, prompts: list[list[int]], greedy: bool = False, vision=None) -> list[list[int]]:
        self.seen.append([self.tok.decode(p) for p in prompts])
        step = len(self.seen) - 1
        end = self.tok.convert_tokens_to_ids("<|im_end|>")
        texts = [self.turns[i][step] for i in range(len(prompts))]
        return [self.tok(text, add_special_tokens=False)["input_ids"] + [end] for text in texts]


def _agent(tok, max_turns=4, budget=400, output_tokens=64) -> multiturn.Agent:
    found = tools.resolve_all(["calculator"])
    return multiturn.Agent(tok, found, max_turns, budget, output_tokens, multiturn.stop_ids(tok))


def _call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def test_multiturn_rollout_runs_tools_and_masks_their_results(tok):
    from rlctl.rollout.samples import Sample

    agent = _agent(tok)
    assert agent.stop_ids == (tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"))
    samples = [Sample(0, {"prompt": "12*13="}, []), Sample(1, {"prompt": "2*3="}, [])]
    for s in samples:
        s.prompt_ids = agent.prompt_inputs(s.row)[0]
    engine = Scripted(tok, [[_call("12*13"), "156"], ["6", "unused"]])
    multiturn.rollout(agent, engine, samples)
    first, second = samples
    assert [len(batch) for batch in engine.seen] == [2, 1], "the second turn runs only the live rollout"
    assert "<tool_response>\n156\n</tool_response>" in engine.seen[1][0]
    assert (first.turns, first.tool_calls, first.tool_errors, first.truncated) == (2, 1, 0, False)
    assert (second.turns, second.tool_calls) == (1, 0)
    assert multiturn.final_answer(first) == "156" and multiturn.final_answer(second) == "6"
    assert [m["role"] for m in first.messages] == ["user", "assistant", "tool", "assistant"]
    # the loss mask: the model's tokens of both turns are 1, the tool result between them 0
    model_text = tok.decode([t for t, m in zip(first.completion_ids, first.loss_mask, strict=True) if m])
    tool_text = tok.decode([t for t, m in zip(first.completion_ids, first.loss_mask, strict=True) if not m])
    assert model_text == _call("12*13") + "<|im_end|>156<|im_end|>"
    assert tool_text == "\n<|im_start|>user\n<tool_response>\n156\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert len(first.loss_mask) == len(first.completion_ids)


def test_tool_errors_reach_the_model_and_are_counted(tok):
    from rlctl.rollout.samples import Sample

    agent = _agent(tok, budget=2000)
    s = Sample(0, {"prompt": "q"}, [])
    s.prompt_ids = agent.prompt_inputs({"prompt": "q"})[0]
    bad = '<tool_call>{"name": "calculator"</tool_call>' + _call("1/0")
    engine = Scripted(tok, [[bad, _call("import os"), "done"]])
    multiturn.rollout(agent, engine, [s])
    assert (s.turns, s.tool_calls, s.tool_errors, s.truncated) == (3, 3, 3, False)
    results = [m["content"] for m in s.messages if m["role"] == "tool"]
    assert "not valid JSON" in results[0] and "ZeroDivisionError" in results[1] and "cannot read" in results[2]
    assert "ZeroDivisionError" in engine.seen[1][0], "the model reads the error"
    assert multiturn.metrics([s]) == {"turns": 3, "tool_calls": 3, "tool_errors": 3, "tool_call_rate": 1.0}


def test_turn_and_token_limits(tok):
    from rlctl.rollout.samples import Sample

    s = Sample(0, {"prompt": "q"}, [])
    s.prompt_ids = tok("q")["input_ids"]
    multiturn.rollout(_agent(tok, max_turns=2), Scripted(tok, [[_call("1+1")] * 3]), [s])
    assert (s.turns, s.tool_calls, s.truncated) == (2, 1, False), "the last allowed turn's call is not run"
    assert s.messages[-1]["role"] == "assistant"
    budget = len(tok(_call("1+1"))["input_ids"]) + 5  # room for one call, not for its result and an answer
    multiturn.rollout(_agent(tok, budget=budget), Scripted(tok, [[_call("1+1")] * 3]), [s])
    assert s.truncated and s.turns == 1 and len(s.completion_ids) <= budget and all(s.loss_mask)


def test_tool_output_is_cut_to_its_token_limit(tok):
    agent = _agent(tok, output_tokens=16)
    assert agent.clip("7") == "7"
    long = agent.clip("1234567890 " * 20)
    assert long.endswith(" [cut]") and len(tok(long.removesuffix(" [cut]"))["input_ids"]) <= 16


# ------------------------------------------------------------------------------------------------ masking
def test_tool_result_tokens_carry_no_gradient(tok):
    """The policy loss on a multi-turn batch: no gradient reaches the log-probs of tool-result tokens, and the
    model's gradients do not change when tool-result tokens that no trained token sees are altered."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlctl.algorithms import POLICY_LOSSES, PolicyLossConfig
    from rlctl.rollout.samples import Sample, collate, token_logprobs

    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)

    def grads(samples):
        model.zero_grad()
        batch = collate(samples, tok.pad_token_id, "cpu")
        logp = token_logprobs(model, batch, 1.0)
        logp.retain_grad()
        adv = torch.ones_like(logp)
        loss, _ = POLICY_LOSSES["ppo"](logp, logp.detach() - 0.1, adv, batch.loss_mask, cfg=PolicyLossConfig())
        loss.backward()
        return logp.grad, {n: p.grad.clone() for n, p in model.named_parameters()}

    middle = Sample(0, {}, [5, 6, 7], [10, 11, 12, 13, 14, 15], loss_mask=[1, 1, 0, 0, 1, 1])
    grad, _ = grads([middle])
    assert (grad[0, 2:4] == 0).all() and (grad[0, [0, 1, 4, 5]] != 0).all()

    trailing = [Sample(0, {}, [5, 6, 7], [10, 11, 12, 13], loss_mask=[1, 1, 0, 0])]
    altered = [Sample(0, {}, [5, 6, 7], [10, 11, 40, 41], loss_mask=[1, 1, 0, 0])]
    _, a = grads(trailing)
    _, b = grads(altered)
    assert all(torch.equal(a[n], b[n]) for n in a)
    _, unmasked = grads([Sample(0, {}, [5, 6, 7], [10, 11, 40, 41])])
    assert not all(torch.equal(a[n], unmasked[n]) for n in a), "the test can tell a masked token from a trained one"


# ------------------------------------------------------------------------------------------- data and rows
def test_products_demonstrations_render_as_the_rollout_does(tok, tmp_path):
    """The SFT rows of the agent demo are the conversation the RL rollout builds, token for token."""
    import json

    from rlctl.data import tasks, tokens
    from rlctl.rollout.samples import Sample

    paths = tasks.products(tmp_path, seed=3)
    sft = [json.loads(line) for line in paths["sft"].read_text().splitlines()]
    with_tool = next(r for r in sft if "<tool_call>" in r["completion"])
    tok.chat_template = tokens.CHATML_COMPACT
    agent = _agent(tok, budget=400)
    prompt = with_tool["prompt"].split("user\n")[1].split("<|im_end|>")[0]
    assert tok.decode(agent.prompt_inputs({"prompt": prompt})[0]) == with_tool["prompt"]
    call, answer = with_tool["completion"].split("<|im_end|>")[0], with_tool["completion"].rsplit("\n", 1)[1]
    s = Sample(0, {"prompt": prompt}, agent.prompt_inputs({"prompt": prompt})[0])
    multiturn.rollout(agent, Scripted(tok, [[call, answer.removesuffix("<|im_end|>")]]), [s])
    assert tok.decode(s.completion_ids) == with_tool["completion"]
    share = sum("<tool_call>" in r["completion"] for r in sft) / len(sft)
    assert abs(share - tasks.TOOL_RATE) < 0.03
    tok.chat_template = tokens.CHATML


def test_rows_offer_their_own_tools(tok, tmp_path):
    import json

    from rlctl.data import tokens
    from rlctl.rollout.samples import Sample

    path = _tool_file(tmp_path, 'def echo(text: str) -> str:\n    """Echo."""\n    return text\n')
    found = tools.resolve_all(["calculator", f"{path}:echo"])
    agent = multiturn.Agent(tok, found, 3, 2000, 64, multiturn.stop_ids(tok))
    only_echo = {"prompt": "q", "tools": json.dumps([found["echo"].schema])}  # as parquet stores it
    assert tokens.row_tools(only_echo) == [found["echo"].schema]
    text = tok.decode(agent.prompt_inputs(only_echo)[0])
    assert '"name": "echo"' in text and '"name": "calculator"' not in text
    everything = tok.decode(agent.prompt_inputs({"prompt": "q"})[0])
    assert '"name": "echo"' in everything and '"name": "calculator"' in everything
    s = Sample(0, only_echo, agent.prompt_inputs(only_echo)[0])
    multiturn.rollout(agent, Scripted(tok, [[_call("1+1"), "x"]]), [s])
    assert s.tool_errors == 1 and "unknown tool 'calculator'" in s.messages[2]["content"], "not offered to this row"
    schemas = [t.schema for t in found.values()]
    assert tokens.length(only_echo, tok, "rl", schemas) == len(agent.prompt_inputs(only_echo)[0])
    assert tokens.length(only_echo, tok, "rl") == len(tok("q")["input_ids"]), "without rl.tools: the plain prompt"


def test_verl_agent_loop_rows_name_their_tools_and_bind_arguments(tok, tmp_path):
    """verl's agent-loop parquet: `extra_info.tools_kwargs` names the tools a row offers; their create kwargs are
    passed on every call of that row and hidden from the schema the model reads."""
    import pandas as pd

    from rlctl import data
    from rlctl.rollout.samples import Sample

    path = _tool_file(
        tmp_path,
        '''
        def grade(answer: str, ground_truth: str) -> str:
            """Says whether an answer is right.

            Args:
                answer: the answer to check.
            """
            return "right" if answer == ground_truth else "wrong"

        def lookup(key: str, table: str) -> str:
            """Looks a key up."""
            return f"{table}[{key}]"
        ''',
    )
    found = tools.resolve_all(["calculator", f"{path}:grade", f"{path}:lookup"])
    agent = multiturn.Agent(tok, found, 3, 2000, 64, multiturn.stop_ids(tok))
    verl_row = {"data_source": "toy", "agent_name": "tool_agent", "ability": "math"}
    rows = [
        {**verl_row, "prompt": [{"role": "user", "content": "6*7?"}], "reward_model": {"ground_truth": "42"},
         "extra_info": {"index": 0, "tools_kwargs": {"grade": {"create_kwargs": {"ground_truth": "42"}}}}},
        {**verl_row, "prompt": [{"role": "user", "content": "2*3?"}], "reward_model": {"ground_truth": "6"},
         "extra_info": {"index": 1, "tools_kwargs": {"lookup": {"create_kwargs": {"table": "t1"}}}}},
    ]  # fmt: skip
    pd.DataFrame(rows).to_parquet(tmp_path / "rl.parquet")  # parquet fills each row's missing tool with null
    read, info = data.load(tmp_path / "rl.parquet", "rl")
    assert info.format == "verl" and read[1]["extra_info"]["tools_kwargs"]["grade"] is None
    first, second = read

    shown = agent.schemas(first)
    assert tools.tool_names(shown) == ["grade"]
    assert list(shown[0]["function"]["parameters"]["properties"]) == ["answer"], "the row supplies ground_truth"
    assert tools.tool_names(agent.schemas(second)) == ["lookup"]
    call = '<tool_call>{"name": "grade", "arguments": {"answer": "42"}}</tool_call>'
    samples = [Sample(i, r, agent.prompt_inputs(r)[0]) for i, r in enumerate(read)]
    multiturn.rollout(agent, Scripted(tok, [[call, "42"], [call, "6"]]), samples)
    assert samples[0].messages[2]["content"] == "right" and samples[0].tool_errors == 0
    assert "unknown tool 'grade'" in samples[1].messages[2]["content"], "not offered to the second row"


def test_planning_a_tool_run_stays_torch_free(tmp_path):
    """`rlctl plan` of the real-model tool preset loads the tools and checks the rows without torch."""
    import subprocess
    import sys

    (tmp_path / "rl.jsonl").write_text('{"prompt": "12*13=", "answer": "156"}\n')
    code = (
        "import sys\nfrom rlctl.cli import main\nsys.argv = ['rlctl', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('HEAVY', [m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules], file=sys.stderr)\n"
    )
    argv = ["plan", "--preset", "qwen1.5b-tool-grpo", "--set", f"data.rl={tmp_path / 'rl.jsonl'}"]
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in proc.stderr, proc.stderr
    assert "Tools calculator, python (up to 4 turns per rollout)" in " ".join(proc.stdout.split())
