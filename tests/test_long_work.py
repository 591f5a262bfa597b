"""The one runner of a page's long work (`app.long_work.LongWork`), plain, without a server: its Stop (armed when
asked for, heard before the next block), its cancel by the page's next image, the line it ends with, and what its
progress says while it waits for the long lane."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from app import torch_thread
from app.long_work import Ended, LongWork, did_not_finish
from app.texts import ProgressLine
from cait.errors import InputError


class Blocks(torch.nn.Module):
    """A model as `torch_thread.call_long` sees one: blocks it waits before (no class stage)."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(depth))
        self.blocks_token_only = torch.nn.ModuleList()

    def forward(self, x: torch.Tensor, after_block=lambda k: None) -> torch.Tensor:
        for k, block in enumerate(self.blocks):
            x = block(x)
            after_block(k)
        return x


@pytest.fixture
def runner():
    return LongWork(gr.Button("Stop", interactive=False))


def page(name: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=name)


def run_blocks(runner: LongWork, request, *, after_block=lambda k: None, **how):
    """The model's four blocks as long work of `request`'s page: (what the runner returned, blocks run)."""
    model, ran = Blocks(), []

    def work() -> str:
        model(torch.zeros(1, 2), lambda k: ran.append(k) or after_block(k))
        return "answer"

    with runner.holding(request) as held:
        got = runner.run(work, held=held, what="test work", stopped=lambda: f"stopped after {len(ran)}", model=model,
                         **how)  # fmt: skip
    return got, ran


def test_a_stop_pressed_ends_the_work_before_its_next_block_with_the_line_said(runner):
    request = page("stopping")
    asked = runner.asked(request)
    assert asked[runner.button].interactive is True  # armed: its Stop enabled at once
    got, ran = run_blocks(runner, request, after_block=lambda k: k == 1 and runner.press(request))
    assert ran == [0, 1] and got == Ended("stopped after 2")
    assert runner.ended(request)[runner.button].interactive is False  # nothing of the page runs: disabled
    got, ran = run_blocks(runner, request)  # asked after the Stop (not armed: taken now): it runs
    assert got == "answer" and ran == [0, 1, 2, 3]


def test_the_pages_next_image_cancels_work_of_an_image_and_no_other(runner):
    request = page("moving-on")
    cancel = lambda k: k == 0 and torch_thread.cancel_long("moving-on")  # noqa: E731 - the page picks an image
    got, ran = run_blocks(runner, request, after_block=cancel)
    assert got == Ended("", cancelled=True) and ran == [0]
    got, ran = run_blocks(runner, request, after_block=cancel, of_image=False)  # a build: no image ends it
    assert got == "answer" and ran == [0, 1, 2, 3]


def test_a_users_error_is_its_first_line_when_the_work_says_so_else_raised(runner):
    request = page("refused")

    def bad() -> None:
        raise InputError("no such scenes\n(the details)")

    with runner.holding(request) as held:
        got = runner.run(bad, held=held, what="test", stopped=str, refused="Could not build")
        assert got == Ended("**Could not build:** no such scenes")
        with pytest.raises(InputError):
            runner.run(bad, held=held, what="test", stopped=str)


def test_an_exception_the_work_raises_for_its_stop_ends_it_as_stopped(runner):
    class OwnStop(Exception):
        pass

    def stops_itself() -> None:
        raise OwnStop

    with runner.holding(page("own")) as held:
        got = runner.run(stops_itself, held=held, what="test", stopped=lambda: "stopped", stopped_by=(OwnStop,))
    assert got == Ended("stopped")
    assert did_not_finish("patching", "again.") == "**Stopped:** patching did not finish; again."


def test_its_progress_says_it_waits_and_a_stop_ends_it_while_it_waits(runner):
    request, told, release = page("waiting"), [], threading.Event()
    ahead = threading.Thread(target=lambda: torch_thread.call_long(lambda: release.wait(30)))
    ahead.start()  # the long lane busy with another page's work
    try:
        runner.asked(request)
        answer = {}
        progress = ProgressLine(lambda value, desc=None, **_: told.append(desc))
        waiting = threading.Thread(target=lambda: answer.update(got=run_blocks(runner, request, progress=progress)))
        waiting.start()
        deadline = time.monotonic() + 30
        while not told and time.monotonic() < deadline:
            time.sleep(0.05)
        assert told and told[0].startswith("waits: 1 long computation")
        assert runner.running(request)  # held while it waits: the Stop stays enabled
        runner.press(request)
        waiting.join(30)
    finally:
        release.set()
        ahead.join(30)
    assert answer["got"] == (Ended("stopped after 0"), [])  # it never started


def test_a_wait_is_said_beside_the_step_said_last_never_without_a_step():
    """Gradio's status shows a description only beside a step's bar (a fraction or done/total): a wait said
    alone (no step) blanked the progress line until the next step, which a view held where no step follows (a
    page's view served meanwhile, an atlas reading its scenes) never sent."""
    said = []
    line = ProgressLine(lambda step, desc=None, unit="steps": said.append((step, desc, unit)))
    line.waiting(2)  # before any step: a bar at 0
    line((3, 38), desc="knocking out block by block", unit="blocks")
    line.waiting(0)  # it gives way to a view: the step and its words stay
    assert said[0] == (0.0, "waits: 2 long computations (of this or other pages) first; Stop ends it now", "steps")
    assert said[1] == ((3, 38), "knocking out block by block", "blocks")
    step, desc, unit = said[2]
    assert (step, unit) == ((3, 38), "blocks") and desc.startswith("knocking out block by block; gives way to")


def test_an_answer_disables_the_stop_only_when_it_was_the_pages_last_work(runner):
    request = page("answers")
    inner = {}

    def outer(held) -> dict:
        inner["out"] = runner.answered(request, lambda held: {"inner": 1})  # another computation of the page ends
        return {"outer": 2}

    out = runner.answered(request, outer)
    assert inner["out"] == {"inner": 1}  # the outer one still runs: the Stop left as it is
    assert out["outer"] == 2 and out[runner.button].interactive is False
    assert isinstance(runner.answered(request, lambda held: None), dict)  # nothing to show: only the Stop


def test_every_press_of_a_stop_is_sent_even_while_the_last_one_is_unanswered():
    """Gradio's frontend skips a "once" event (a click's default) while its last submission is pending: a Stop
    pressed again before its last press was answered (a busy server) was dropped, and work asked in between ran
    on."""
    with gr.Blocks() as demo:
        stops = LongWork(gr.Button("Stop", interactive=False))
        stops.wire_stop(demo)
    pressed = [d for d in demo.config["dependencies"] if [stops.button._id, "click"] in map(list, d["targets"])]
    assert [d["trigger_mode"] for d in pressed] == ["multiple"]
