"""Every word the page of `rlctl ui` says of its own, in English and Chinese: component labels and help texts by
component name, table column names, and the page's messages by key. The CLI's own messages (a config refused, the
plan, a command's output) are shown as the CLI prints them. No UI library here but in `relabel`."""

from __future__ import annotations

from typing import Any

LANGUAGES = {"en": "English", "zh": "中文"}

# name -> (English, Chinese): a component's label, a button's text, a tab's title, a static text's words
LABELS: dict[str, tuple[str, str]] = {
    "title": ("## rlctl: post-training without code", "## rlctl：无需写代码的后训练"),
    "lang": ("Language", "语言"),
    "tab_config": ("1 Recipe & config", "1 配方与配置"),
    "recipe": ("Recipe", "配方"),
    "algorithm": ("Algorithm (--algorithm)", "算法 (--algorithm)"),
    "hardware": ("Hardware (--hardware, e.g. 1xH100-80GB)", "硬件 (--hardware，例如 1xH100-80GB)"),
    "stages": ("Stages (--stages)", "阶段 (--stages)"),
    "saved": ("Saved config (a YAML file of this folder)", "已保存的配置（本文件夹中的 YAML 文件）"),
    "list_saved": ("List configs", "列出配置"),
    "load_saved": ("Load", "载入"),
    "form": ("Common settings (each change is a --set item below)", "常用设置（每次修改写成下方的一条 --set）"),
    "form_name_or_path": ("model", "模型"),
    "form_adapter": ("full weights or LoRA", "全参数或 LoRA"),
    "form_lora_r": ("LoRA rank", "LoRA 秩"),
    "form_max_steps": ("steps", "步数"),
    "form_learning_rate": ("learning rate", "学习率"),
    "form_batch_size": ("batch", "批大小"),
    "form_prompts_per_step": ("prompts per step", "每步提示数"),
    "form_group_size": ("completions per prompt", "每个提示的采样数"),
    "form_max_new_tokens": ("longest completion", "最长生成长度"),
    "form_temperature": ("sampling temperature", "采样温度"),
    "form_use_vllm": ("vLLM for rollouts", "用 vLLM 生成"),
    "sets": ("Overrides (--set KEY=VALUE, one a line)", "覆盖项（--set 键=值，每行一条）"),
    "config_path": ("Config file (saved when you plan or start)", "配置文件（规划或开始时保存）"),
    "yaml": ("Config (YAML)", "配置（YAML）"),
    "tab_data": ("2 Data", "2 数据"),
    "data_intro": (
        "The recipe's generated task, or a file of this folder: pick one, page through it, use it for a role; "
        '"Read the data" reads every dataset as `rlctl plan` does.',
        "配方自带的生成任务，或本文件夹中的文件：选择文件、翻页预览、指定其用途；"
        "“读取数据”按 `rlctl plan` 的方式读取所有数据集。",
    ),
    "data_role": ("Role (data.ROLE)", "用途 (data.ROLE)"),
    "data_path": ("File (in this folder)", "文件（本文件夹内）"),
    "list_data": ("List files", "列出文件"),
    "use_data": ("Use this file", "使用此文件"),
    "preview_prev": ("◀ Previous", "◀ 上一页"),
    "data_page": ("Page", "页码"),
    "preview_next": ("Next ▶", "下一页 ▶"),
    "data_preview": ("The file's rows", "文件内容"),
    "read_data": ("Read the data", "读取数据"),
    "data_text": ("Formats, rows, lengths", "格式、行数、长度"),
    "data_rows": ("First rows", "前几行"),
    "tab_plan": ("3 Plan", "3 规划"),
    "run_dir": ("Run directory (--run-dir)", "运行目录 (--run-dir)"),
    "plan_btn": ("Plan", "规划"),
    "start": ("Start training", "开始训练"),
    "command": ("The same run from a terminal (in this folder)", "在终端中运行同一训练（在本文件夹中）"),
    "plan_text": ("rlctl plan", "rlctl plan 的输出"),
    "memory": ("Memory per phase against the budget", "各阶段显存/内存与预算"),
    "tab_run": ("4 Run", "4 运行"),
    "watched": ("Run directory", "运行目录"),
    "stop": ("Stop (checkpoint)", "停止（保存检查点）"),
    "resume": ("Resume", "继续"),
    "headline": ("Progress", "进度"),
    "loss_plot": ("Training loss", "训练损失"),
    "reward_plot": ("RL reward and KL", "RL 奖励与 KL"),
    "accuracy_plot": ("Held-out accuracy", "留出集准确率"),
    "scores_plot": ("Held-out margins, rewards and losses", "留出集间隔、奖励与损失"),
    "axis_step": ("step (stages one after another)", "步数（各阶段依次相接）"),
    "axis_value": ("value", "数值"),
    "rl_samples": (
        "RL samples of the latest logged step: its best and worst completions with their rewards",
        "最近记录的一步 RL 样本：奖励最高与最低的生成及其奖励",
    ),
    "device": ("Devices: memory and utilisation against the plan's budget", "设备：内存与利用率对比规划预算"),
    "log": ("Output of the latest command on this run (its end)", "该运行最近一条命令的输出（末尾）"),
    "tab_runs": ("5 Runs", "5 运行记录"),
    "runs_folder": ("Runs folder", "运行文件夹"),
    "list_runs": ("List", "列出"),
    "runs_table": ("Runs", "运行列表"),
    "run_a": ("Run A", "运行 A"),
    "run_b": ("Run B", "运行 B"),
    "compare": ("Compare", "比较"),
    "open_a": ("Watch A", "查看 A"),
    "compare_plot": ("Loss, reward and KL of A and B", "A 与 B 的损失、奖励与 KL"),
    "final_table": ("Final held-out metrics per stage", "各阶段最终留出集指标"),
    "diff": ("Config differences", "配置差异"),
    "tab_chat": ("6 Chat", "6 对话"),
    "model_pick": ("Model (final folder, checkpoint or export of the run)", "模型（该运行的最终模型、检查点或导出）"),
    "list_models": ("List the run's models", "列出该运行的模型"),
    "system_prompt": ("System prompt (conversation runs)", "系统提示（对话格式的运行）"),
    "temperature": ("Temperature (0: greedy, as rlctl eval)", "温度（0：贪心，与 rlctl eval 相同）"),
    "top_p": ("Top-p", "Top-p 采样"),
    "max_new": ("Max new tokens", "最多生成的 token 数"),
    "chat": ("Try it", "试一试"),
    "prompt": ("Prompt", "提示"),
    "send": ("Send", "发送"),
    "clear_chat": ("Clear", "清空"),
    "tab_eval": ("7 Evaluate", "7 评测"),
    "eval_intro": (
        "Runs `rlctl eval RUN` on the run's held-out data (the Run tab's run); its results appear below.",
        "在该运行的留出数据上执行 `rlctl eval RUN`（运行页所选的运行）；结果显示在下方。",
    ),
    "eval_limit": ("Rows (--limit)", "行数 (--limit)"),
    "eval_samples": ("Samples per prompt (--samples; pass@k)", "每个提示的采样数 (--samples；pass@k)"),
    "eval_btn": ("Evaluate", "评测"),
    "eval_table": ("Results", "结果"),
    "eval_rows": ("Samples", "样例"),
    "tab_export": ("8 Export", "8 导出"),
    "export_format": ("Format (--format)", "格式 (--format)"),
    "gguf_type": ("GGUF weights (--gguf-type)", "GGUF 权重类型 (--gguf-type)"),
    "export_out": ("Folder (--out; default RUN/export)", "输出文件夹（--out；默认 RUN/export）"),
    "export_repo": ("Also push to Hub repo (--push namespace/name)", "同时推送到 Hub 仓库（--push 命名空间/名称）"),
    "card_btn": ("Show the model card", "显示模型卡"),
    "export_btn": ("Export", "导出"),
    "card": ("Model card (README.md)", "模型卡（README.md）"),
}

# name -> (English, Chinese): help text under a component
INFO: dict[str, tuple[str, str]] = {
    "recipe": ("A shipped preset: `rlctl presets list`.", "内置预设：`rlctl presets list`。"),
    "sets": (
        "Any key of docs/config.md; the form above writes here too.",
        "docs/config.md 中的任意键；上方表单也写在这里。",
    ),
    "data_path": ("A .jsonl, .json, .parquet, .csv or .tsv file.", ".jsonl、.json、.parquet、.csv 或 .tsv 文件。"),
    "run_dir": ("A new folder of this folder.", "本文件夹中的一个新文件夹。"),
    "temperature": ("Above 0 samples, with top-p.", "大于 0 时按 top-p 采样。"),
    "gguf_type": ("f16 keeps the weights; q8_0 quantizes them to 8 bits.", "f16 保留原权重；q8_0 量化为 8 位。"),
}

# column name -> Chinese
COLUMNS: dict[str, str] = {
    "stage": "阶段",
    "phase": "步骤",
    "peak GiB": "峰值 GiB",
    "budget GiB": "预算 GiB",
    "headroom GiB": "余量 GiB",
    "fits": "是否放得下",
    "device": "设备",
    "memory GiB": "内存 GiB",
    "of GiB": "总量 GiB",
    "utilisation %": "利用率 %",
    "plan budget GiB": "规划预算 GiB",
    "path": "路径",
    "name": "名称",
    "stages": "阶段",
    "completed": "已完成",
    "latest": "最新进度",
    "metric": "指标",
    "A": "A",
    "B": "B",
    "key": "键",
    "value": "数值",
    "prompt": "提示",
    "answer": "答案",
    "completion": "生成",
    "correct": "正确",
    "reward": "奖励",
    "rank": "排名",
    "step": "步数",
}
SAME_IN_BOTH = {"A", "B"}  # column names Chinese writes as English does

# key -> (English, Chinese): the page's own messages, with {placeholders}
MESSAGES: dict[str, tuple[str, str]] = {
    "job_running": ("{command}: running (pid {pid})", "{command}：运行中（pid {pid}）"),
    "job_done": ("{command}: done (exit 0)", "{command}：完成（退出码 0）"),
    "job_stopped": (
        "{command}: stopped at a checkpoint (exit {code}); Resume continues from it",
        "{command}：已在检查点停止（退出码 {code}）；“继续”从该检查点接着训练",
    ),
    "job_failed": (
        "{command}: failed (exit {code}); the log below says why",
        "{command}：失败（退出码 {code}）；原因见下方日志",
    ),
    "no_run": ("no run yet: start one from the Plan tab", "还没有运行：在“规划”页开始一个"),
    "finished": ("finished", "已完成"),
    "not_from_page": ("not started from this page", "不是从本页面启动的"),
    "pick_first": (
        "There is no config yet: pick a recipe on tab 1 (or load a saved config there) first.",
        "还没有配置：请先在第 1 页选择配方（或载入已保存的配置）。",
    ),
    "file_used": ("data.{role} reads {path} ({rows} rows)", "data.{role} 读取 {path}（{rows} 行）"),
    "preview_state": (
        "rows {first}–{last} of {total} · page {page} of {pages}",
        "第 {first}–{last} 行，共 {total} 行 · 第 {page}/{pages} 页",
    ),
    "stopping": ("Stopping {run} at the next step with a checkpoint...", "正在停止 {run}：下一步保存检查点后停止……"),
    "stopping_other": (
        "Stopping {run} (rlctl pid {pid}, not started from this page) at the next step with a checkpoint...",
        "正在停止 {run}（rlctl pid {pid}，不是从本页面启动的）：下一步保存检查点后停止……",
    ),
    "nothing_to_stop": (
        "Nothing to stop: no rlctl is training in {run}.",
        "没有可停止的：{run} 中没有正在训练的 rlctl。",
    ),
    "chat_plain": (
        "This run trained on plain-text prompts: your text is sent as is (no chat template, no history), as "
        "`rlctl eval` does. Example from its task: `{example}`",
        "该运行用纯文本提示训练：你的文字按原样发送（不套对话模板、不带历史），与 `rlctl eval` 相同。"
        "任务示例：`{example}`",
    ),
    "chat_chat": (
        "This run trained on conversations: the whole conversation goes through the model's chat template, as "
        "`rlctl eval` does. Example from its task: `{example}`",
        "该运行用对话训练：整段对话经模型的对话模板发送，与 `rlctl eval` 相同。任务示例：`{example}`",
    ),
    "no_models": (
        "{run} has no model yet (no final folder, checkpoint or export).",
        "{run} 还没有模型（没有最终模型、检查点或导出）。",
    ),
    "eval_none": ("No evaluation of this run yet.", "该运行还没有评测结果。"),
    "eval_result": ("Results of {path}", "{path} 的结果"),
    "export_wrote": ("Written: {path}", "已写入：{path}"),
    "saved_loaded": ("Loaded {path} into the editor.", "已将 {path} 载入编辑器。"),
    "note": ("note: {text}", "提示：{text}"),
    "best": ("best", "最好"),
    "worst": ("worst", "最差"),
    "alarm": ("alarm: {text}", "警报：{text}"),
}


def pick(pair: tuple[str, str], lang: str) -> str:
    return pair[1] if lang == "zh" else pair[0]


def label(lang: str, name: str) -> str:
    """A component's label (a button's text, a tab's title) in `lang`; "" for a component without one."""
    return pick(LABELS[name], lang) if name in LABELS else ""


def info(lang: str, name: str) -> str:
    return pick(INFO[name], lang) if name in INFO else ""


def columns(lang: str, names: list[str]) -> list[str]:
    return [COLUMNS.get(n, n) if lang == "zh" else n for n in names]


def say(lang: str, key: str, **values: Any) -> str:
    """A message of the page in `lang`, its placeholders filled."""
    return pick(MESSAGES[key], lang).format(**values)


def language(lang: str | None) -> str:
    """A language the page speaks (English where `lang` is none of them)."""
    return lang if lang in LANGUAGES else "en"


# ------------------------------------------------------------------------------------------- switching language
def labelled(named: dict[str, Any]) -> list:
    """The components whose words change with the language (a label, a text, a tab title or table columns)."""
    return [c for n, c in named.items() if n in LABELS or n.startswith("form__") or hasattr(c, "headers")]


def relabel(named: dict[str, Any], components: list, lang: str) -> dict:
    """Every component's words in `lang`: {component: update}."""
    import gradio as gr

    lang = language(lang)
    out = {}
    for name, comp in named.items():
        if comp not in components:
            continue
        if name.startswith("form__"):
            key = name.removeprefix("form__").replace("__", ".")
            out[comp] = gr.update(label=f"{key}  ·  {label(lang, 'form_' + key.split('.')[-1])}")
        elif isinstance(comp, gr.Button) or (isinstance(comp, gr.Markdown) and name in LABELS):
            out[comp] = gr.update(value=label(lang, name))
        elif isinstance(comp, gr.LinePlot):
            out[comp] = gr.update(
                title=label(lang, name), x_title=label(lang, "axis_step"), y_title=label(lang, "axis_value")
            )
        elif isinstance(comp, gr.Dataframe):
            english = [COLUMNS_BACK.get(h, h) for h in comp.headers]
            out[comp] = gr.update(label=label(lang, name) or None, headers=columns(lang, english))
        else:
            out[comp] = gr.update(label=label(lang, name), **({"info": info(lang, name)} if name in INFO else {}))
    return out


COLUMNS_BACK = {zh: en for en, zh in COLUMNS.items()}
