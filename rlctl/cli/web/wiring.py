"""How the page of `rlctl ui` is wired, by name: each component is registered under a name (its element id, with
dashes), each handler takes the values of the components its parameters name and returns a typed view (a
dataclass) whose fields name the components they update; a field left at `SAME` leaves its component as it is."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Final

import gradio as gr


class Same:
    """The value of a view's field that leaves its component unchanged."""

    def __repr__(self) -> str:
        return "SAME"


SAME: Final = Same()


class Components:
    """The page's components by name; handlers are wired to them by their parameters' and fields' names."""

    def __init__(self) -> None:
        self.named: dict[str, gr.components.Component | gr.Tab | gr.Accordion] = {}

    def add(self, name: str, component):
        """Register `component` under `name` (its element id: `name` with dashes) and return it."""
        if name in self.named:
            raise ValueError(f"two components named {name}")
        self.named[name] = component
        return component

    def __getitem__(self, name: str):
        return self.named[name]

    def outputs(self, view: type) -> list:
        """The components a view of type `view` updates: one per field, by name."""
        return [self.named[f.name] for f in dataclasses.fields(view)]

    def updates(self, shown: Any) -> Any:
        """A view as Gradio takes it: a value per field in the order of `outputs`, `gr.skip()` for a field left at
        SAME (a list, never a dict: an empty dict would be taken as the value of a single output)."""
        values = [gr.skip() if v is SAME else v for v in (getattr(shown, f.name) for f in dataclasses.fields(shown))]
        return values[0] if len(values) == 1 else values  # one output takes its value as is

    def on(self, triggers, handler: Callable[..., Any], view: type, names: list[str] | None = None, **options):
        """Wire `handler` to `triggers` (an event or a list of them): its parameters name its input components (or
        `names` does, in the order of its parameters), its return value is a `view` whose fields name the components
        it updates. Returns the event, for `then`."""
        run, inputs = self._bound(handler, names)
        triggers = triggers if isinstance(triggers, list) else [triggers]
        return gr.on(triggers, run, inputs, self.outputs(view), **options)

    def then(self, event, handler: Callable[..., Any], view: type, **options):
        """`handler` wired as `on` wires it, run after `event` is done."""
        run, inputs = self._bound(handler, None)
        return event.then(run, inputs, self.outputs(view), **options)

    def _bound(self, handler: Callable[..., Any], names: list[str] | None):
        """The function Gradio calls (values in, the view's updates out) and its input components."""
        given = names is not None
        names = names if given else list(inspect.signature(handler).parameters)

        def run(*values):
            shown = handler(*values) if given else handler(**dict(zip(names, values, strict=True)))
            return self.updates(shown)

        run.__name__ = getattr(handler, "__name__", "handler")
        return run, [self.named[n] for n in names]
