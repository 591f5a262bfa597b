"""app.torch_thread: every computing handler of the app runs on one thread, with the caller's context."""

import contextvars
import inspect
import threading

import pytest
import torch

from app import torch_thread

WHO = contextvars.ContextVar("who", default="nobody")


def test_calls_from_any_thread_run_on_one_thread_with_the_callers_context():
    seen = []

    def where() -> tuple[int, str]:
        return threading.get_ident(), WHO.get()

    def from_a_thread(name: str) -> None:
        WHO.set(name)
        seen.append(torch_thread.call(where))

    threads = [threading.Thread(target=from_a_thread, args=(f"caller {i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({ident for ident, _ in seen}) == 1 and threading.get_ident() not in {ident for ident, _ in seen}
    assert sorted(name for _, name in seen) == [f"caller {i}" for i in range(4)]  # Gradio's event context
    assert torch_thread.call(torch_thread.call, where)[0] == seen[0][0]  # nested: runs at once, no deadlock


def test_exceptions_reach_the_caller():
    def fails():
        raise ValueError("bad checkpoint")

    with pytest.raises(ValueError, match="bad checkpoint"):
        torch_thread.call(fails)
    assert torch_thread.call(lambda: 3) == 3  # the thread survives


def test_handlers_keep_their_signature_and_run_with_the_interactive_threads():
    def analyse(image: str, evt: int = 0) -> tuple[int, bool]:
        return torch.get_num_threads(), torch_thread.on_torch_thread()

    wrapped = torch_thread.handler(analyse)
    assert inspect.signature(wrapped) == inspect.signature(analyse)  # what Gradio reads for event data
    callers_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the caller's own setting (another test, a script) must not leak into the handler
    try:
        assert wrapped("x") == (torch_thread.interactive_threads(), True)
        assert torch_thread.handler(analyse, batched=True)("x") == (torch_thread.all_threads(), True)
    finally:
        torch.set_num_threads(callers_threads)
    assert torch_thread.call(torch.get_num_threads) == torch_thread.all_threads()  # restored after the handler
    assert torch_thread.interactive_threads() == max(1, torch_thread.all_threads() - 1)


def test_a_generator_handler_runs_each_step_on_the_torch_thread():
    def steps(n: int):
        for i in range(n):
            yield i, torch_thread.on_torch_thread()

    wrapped = torch_thread.handler(steps, batched=True)
    assert inspect.isgeneratorfunction(wrapped)  # Gradio streams each update
    assert list(wrapped(3)) == [(0, True), (1, True), (2, True)]
    assert list(wrapped(0)) == []
