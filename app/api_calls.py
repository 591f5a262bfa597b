"""Raw calls of the app's API endpoints (`gr.api`, i.e. /analyze) checked before Gradio reads them: as many
inputs as the endpoint's signature names, each of its JSON type, the image a file given as Gradio's FileData.

Gradio counts the inputs and moves the files before any handler runs, and prints a traceback for each call it
refuses there (a short list of inputs, a path that was never uploaded, a URL it will not fetch), while a string
where the signature says int reaches the handler as a string. A caller's mistake is not the server's: each is
refused here in one line, logged as one line, before the handler, whatever the handler does with its inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gradio as gr
import httpx
from gradio.components.api_component import Api
from gradio.data_classes import FileData
from gradio.utils import get_function_params

from app.shared import log
from cait.errors import cut, shown

FILE_TYPE = "gradio.FileData"  # the "_type" of a file's "meta" in a call (gradio_client.handle_file makes it)


def refused(endpoint: str, message: str) -> gr.Error:
    """A bad call's answer, logged as one line (Gradio would print the traceback)."""
    log.info("/%s refused: %s", endpoint, message)
    return gr.Error(message, print_exception=False)


def _whole(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float))


def _file(value: Any) -> bool:
    meta = value.get("meta") if isinstance(value, dict) else None
    return isinstance(meta, dict) and meta.get("_type") == FILE_TYPE and isinstance(value.get("path"), str)


# what each annotation of an endpoint's parameter takes from JSON, and how a refusal says it
_KINDS = {
    int: (_whole, "a whole number"),
    float: (_number, "a number"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    str: (lambda v: isinstance(v, str), "a string"),
    FileData: (_file, "a file uploaded to this server (gradio_client: handle_file(path))"),
}


@dataclass(frozen=True)
class Signature:
    """An endpoint's parameters, in order, with their annotations."""

    endpoint: str
    names: tuple[str, ...]
    types: tuple[type, ...]

    @classmethod
    def of(cls, endpoint: str, fn: Any) -> Signature:
        params = get_function_params(fn)  # what gr.api built the endpoint's inputs from
        return cls(endpoint, tuple(p[0] for p in params), tuple(p[3] for p in params))

    def problem(self, inputs: list[Any]) -> str | None:
        """What is wrong with a call's inputs, in one line (None: nothing this check knows of)."""
        if len(inputs) != len(self.names):
            return (
                f"/{self.endpoint} takes {len(self.names)} inputs ({', '.join(self.names)}), got {len(inputs)}; "
                "gradio_client fills in the defaults of those not given by name"
            )
        for name, kind, value in zip(self.names, self.types, inputs):
            fits, said = _KINDS.get(kind, (lambda v: True, ""))
            if isinstance(value, bool) and kind is not bool or not fits(value):
                return f"{name} must be {said}, got {shown(value)}"
        return None


def guard_api_calls(demo: gr.Blocks) -> None:
    """Check every call of `demo`'s `gr.api` endpoints before Gradio reads its inputs (`Signature.problem`), and
    refuse in one line what Gradio's own reading refuses (a file that was not uploaded, a URL it will not fetch)."""
    signatures = {
        id(fn): Signature.of(fn.api_name, fn.fn)
        for fn in demo.fns.values()
        if fn.api_name and fn.inputs and all(isinstance(block, Api) for block in fn.inputs)
    }
    read = demo.preprocess_data

    async def checked(block_fn: Any, inputs: list[Any], state: Any, explicit_call: bool = False) -> Any:
        signature = signatures.get(id(block_fn))
        if signature is None:  # the page's own events
            return await read(block_fn, inputs, state, explicit_call)
        if (problem := signature.problem(inputs)) is not None:
            raise refused(signature.endpoint, problem)
        try:
            return await read(block_fn, inputs, state, explicit_call)
        except (ValueError, httpx.HTTPError) as e:  # Gradio's InvalidPathError is a ValueError
            raise refused(
                signature.endpoint, f"the file was refused: {cut(str(e).splitlines()[0], limit=200)}"
            ) from None

    demo.preprocess_data = checked  # Gradio's process_api reads every call's inputs through it
