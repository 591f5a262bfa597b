"""The /analyze API: its one endpoint with every keyword declared (`Analyze.analyze`), and its answer as a plain
function of a `LoadedModel` (`answer`): the analysis' numbers and the sections a call opts into (a saliency map,
the causal view, the logit lens, activation patching, token patching), each in the layout the page's JSON download
or the Mechanisms tab uses for it. The server computes the sections of many passes (the causal view, both
patchings) on the long lane, as the tabs do, and the rest on the quick lane (`app.torch_thread`)."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from inspect import Parameter
from typing import Any, Callable

import gradio as gr
from gradio.data_classes import FileData

import cait
from app import causal_view, compare_view, mechanisms_view, session, torch_thread
from app.api_calls import refused
from app.images import ImageInputError, payload_path
from app.models import LoadedModel, ModelCache, ModelChoice
from app.shared import INTERNAL_ERROR, log
from cait import explain
from cait.errors import InputError, shown
from cait.explain.attribution import checked_options
from cait.explain.token_patching import checked_region
from cait.robustness import parse_corruption


class AnalyzeError(InputError):
    """A keyword of an /analyze call that cannot work; the message names the choices."""


def _choice(value: str, choices, what: str) -> str:
    if value not in choices:
        raise AnalyzeError(f"unknown {what} {shown(value)}; choose from {', '.join(choices)}")
    return value


def _corruption(spec: str) -> tuple[str, int]:
    try:
        return parse_corruption(spec)
    except InputError:
        raise
    except ValueError as e:  # parse_corruption's one line on the spec it was given
        raise AnalyzeError(str(e)) from None


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed takes


def _seed(value: Any) -> int:
    """SmoothGrad's seed when torch can take it; AnalyzeError in one line otherwise."""
    low, high = SEED_RANGE
    if not low <= int(value) <= high:
        raise AnalyzeError(f"seed must be a whole number from -2**63 to 2**64 - 1 (torch's seeds), got {shown(value)}")
    return int(value)


# /analyze's keywords in the order it published them (a caller may pass them by position); an option since, after
PUBLISHED = ("image", "method", "target", "ig_steps", "causal", "ig_baseline", "signed", "smoothgrad_samples",
             "smoothgrad_stdev", "rollout_head_fusion", "rollout_discard_ratio", "seed", "logit_lens", "patching",
             "token_patching", "token_region")  # fmt: skip
SECTIONS = ("causal", "logit_lens", "patching", "token_patching")  # the opt-in sections, in the answer's order
LONG_SECTIONS = ("causal", "patching", "token_patching")  # many passes each: computed on the long lane


@dataclass(frozen=True)
class Call:
    """One /analyze call, its keywords checked (`checked_call`)."""

    method: str
    target: int
    causal: bool
    logit_lens: bool
    corruption: tuple[str, int] | None  # activation patching's corrupted run
    token_corruption: tuple[str, int] | None  # token patching's
    region: int
    seed: int
    options: explain.MethodOptions


def checked_call(
    loaded: LoadedModel,
    *,
    method: str,
    target: int,
    causal: bool,
    logit_lens: bool,
    patching: str,
    seed: int,
    token_patching: str = "",
    token_region: Any = mechanisms_view.DEFAULT_REGION,
    **options: Any,
) -> Call:
    """An /analyze call's keywords (`Analyze.analyze` says each) checked before any work: an InputError in one
    line for a bad method, option, class, seed, corruption or region side."""
    checked = checked_options(**options)  # the methods' bounds: a bad value is one line naming it
    session.checked_target(int(target), loaded.cfg.num_classes)
    if method:
        _choice(method, explain.METHODS.names(loaded.cfg.depth_token_only), "method")
    corruption = _corruption(patching) if patching else None
    token_corruption = _corruption(token_patching) if token_patching else None
    region = checked_region(token_region, loaded.cfg.grid_size, name="token_region")  # the page slider's bounds
    return Call(method, int(target), bool(causal), bool(logit_lens), corruption, token_corruption, region, _seed(seed),
                checked)  # fmt: skip


def answer_now(loaded: LoadedModel, path: str, call: Call) -> tuple[dict[str, Any], dict[str, Callable[[], Any]]]:
    """What an /analyze call answers at once (the analysis' numbers, a saliency map, the logit lens: a few passes)
    and the sections of many passes it asks for, each as work still to do (section name -> work()): the Causal
    tab's numbers, activation and token patching, in the layout the page's JSON download and the Mechanisms tab
    use. Raises ImageInputError for a bad file, TargetError for a class the model does not have."""
    a = session.analyse(loaded, path)
    out = session.numbers(loaded, a)
    out["methods"] = explain.METHODS.names(loaded.cfg.depth_token_only)
    target = session.api_target(a, call.target, loaded.cfg.num_classes)
    if call.method:
        out["attribution"] = session.attribution_for_api(
            loaded, a, method=call.method, target=target, options=call.options, seed=call.seed
        )
    x, model, later = a.x.to(loaded.device), loaded.model, {}
    if call.causal:
        later["causal"] = lambda: causal_view.numbers(model, x, causal_view.compute(model, x, target))
    if call.logit_lens:
        out["logit_lens"] = mechanisms_view.lens(model, x, target, loaded.labels)
    if call.corruption:
        corrupted = mechanisms_view.corrupted_input(a.view, loaded.cfg, *call.corruption)[1].to(loaded.device)
        later["patching"] = functools.partial(
            mechanisms_view.patching_numbers, model, x, corrupted, target, corruption=call.corruption
        )
    if call.token_corruption:
        corrupted = mechanisms_view.corrupted_input(a.view, loaded.cfg, *call.token_corruption)[1].to(loaded.device)
        later["token_patching"] = functools.partial(
            mechanisms_view.token_numbers, model, x, corrupted, target, region=call.region,
            corruption=call.token_corruption,
        )  # fmt: skip
    return out, later


def in_order(out: dict[str, Any], sections: dict[str, Any]) -> dict[str, Any]:
    """The answer `out` with its opt-in `sections` in the order SECTIONS lists them."""
    everything = out | sections
    first = {k: v for k, v in everything.items() if k not in SECTIONS}
    return first | {k: everything[k] for k in SECTIONS if k in everything}


def answer(loaded: LoadedModel, path: str, **asked: Any) -> dict[str, Any]:
    """The answer of /analyze (`Analyze.analyze` says each keyword; `checked_call`) for the image at `path`, every
    section computed here, on the caller's thread. Raises ImageInputError for a bad file, an InputError in one
    line for a bad class, method, option, corruption or region side, each checked before any work."""
    out, later = answer_now(loaded, path, checked_call(loaded, **asked))
    return in_order(out, {name: work() for name, work in later.items()})


class Analyze:
    """The endpoint, answered by the server's default model."""

    def __init__(self, cache: ModelCache, default: ModelChoice):
        self.cache, self.default = cache, default

    def published(self) -> Callable[..., dict]:
        """`analyze` with every method option as a keyword of its own, with its declared default and type (what
        gr.api publishes and `app.api_calls` checks), in /analyze's published order, a newer option after them."""
        own = list(inspect.signature(self.analyze).parameters.values())[:-1]  # without **options
        options = [Parameter(o.name, Parameter.POSITIONAL_OR_KEYWORD, default=o.default, annotation=o.kind)
                   for o in explain.method_options().values()]  # fmt: skip
        ordered = sorted(
            own + options, key=lambda p: PUBLISHED.index(p.name) if p.name in PUBLISHED else len(PUBLISHED)
        )
        signature = inspect.Signature(ordered, return_annotation=dict)

        @functools.wraps(self.analyze)
        def analyze(*args: Any, **kwargs: Any) -> dict:
            return self.analyze(**signature.bind(*args, **kwargs).arguments)

        analyze.__signature__ = signature  # type: ignore[attr-defined]
        analyze.__annotations__ = {p.name: p.annotation for p in ordered} | {"return": dict}
        return analyze

    def analyze(
        self,
        image: FileData,
        method: str = "",
        target: int = -1,
        causal: bool = False,
        seed: int = session.DEFAULT_SEED,
        logit_lens: bool = False,
        patching: str = "",
        token_patching: str = "",
        token_region: int = mechanisms_view.DEFAULT_REGION,
        **options: Any,
    ) -> dict:
        """Predictions and class-attention maps for one image, by the server's default model.

        image: the image file (gradio_client: handle_file(path)).
        method: "" for none, or a saliency method (see the "methods" field of the answer) to also compute
            its patch-grid map for class `target` (-1: the top prediction), with the method options by name,
            each as its method declares it (`cait.explain.method_options`: ig_steps, ig_baseline, signed, ...),
            and SmoothGrad's noise from `seed` (the same map for the same call).
        causal: also the Causal tab's numbers for class `target` (direct logit attribution per head and
            patch, knockout profile, every head's zero ablation; about SA depth / 2 + 1.5 forward passes).
        logit_lens: also the logit lens for class `target` (per SA depth: its probability and the top-1, where
            the answer forms; about 1.3 forward passes). Opt-in by keyword: logit_lens=True.
        patching: "CORRUPTION:SEVERITY" (e.g. "gaussian_noise:3"): also activation patching of class `target`'s
            logit from the image into itself under that ImageNet-C corruption, per block, branch and CA head
            (about SA depth + 5 forward passes). Opt-in by keyword: patching="gaussian_noise:3".
        token_patching: "CORRUPTION:SEVERITY": also token patching of class `target`'s logit into the class
            stage against the image under that corruption, per region of `token_region` x `token_region`
            patches (1 to the patch grid's side, as the Mechanisms tab's slider), both directions, beside the
            class attention per region with their rank correlations (the Mechanisms tab's map; at least two
            forward passes and the class token's own path per region and direction). Opt-in by keyword:
            token_patching="contrast:5", token_region=2.
        Returns {"model", "image", "predictions" (top 5), "probabilities", "class_attention" {"maps"
        [ca_layer][head][row][col], "mean", "self_share"}, "residual_ratios", "methods"[, "attribution"
        {"method", "target", "options", "patch"}][, "causal"][, "logit_lens"][, "patching"][, "token_patching"]};
        each of the last three has a "layout" key saying its arrays.
        """
        path = payload_path(image)
        if path is None:
            raise refused("analyze", "no image given")
        asked = dict(method=method, target=target, causal=causal, logit_lens=logit_lens, patching=patching)
        asked |= dict(token_patching=token_patching, token_region=token_region)
        return _calmly("analyze", lambda: self._answer(path, seed=seed, **asked, **options))

    def _answer(self, path: str, **asked: Any) -> dict[str, Any]:
        """`answer` as the server computes it, off the quick lane: what it answers at once on the quick lane (a
        view's work), its sections of many passes on the long lane (`app.torch_thread`), as the tabs compute
        them, so that neither blocks the pages' views; both with a one-image pass's threads."""
        loaded = torch_thread.call(self.cache.get, self.default)
        call = checked_call(loaded, **asked)
        out, later = torch_thread.handler(answer_now)(loaded, path, call)
        if not later:
            return out
        work = lambda: {name: compute() for name, compute in later.items()}  # noqa: E731
        return in_order(out, torch_thread.call_long(work, model=loaded.model))


class CompareImage:
    """The /compare endpoint: one image through the server's default model (A) and a second variant (B), both
    from the one model cache."""

    def __init__(self, cache: ModelCache, default: ModelChoice):
        self.cache, self.default = cache, default

    def compare(self, image: FileData, model_b: str = "", target: int = -1) -> dict:
        """One image through the server's default model (A) and the variant `model_b` (a name `cait.list_models`
        lists; its weights as the server finds them, a random init only when the server runs with --random-init):
        both top 5, every CA head's map of both paired by layer and head, B minus A where the grids match, each
        head's direct write to class `target`'s logit (-1: A's top class), mean |gamma| and the image's residual
        ratios per block of both. One forward pass of each model.

        Returns {"model_a", "model_b", "target", "predictions_a", "predictions_b", "layout", "pairs", "maps_a",
        "maps_b", "differences", "dla_a", "dla_b", "gamma_a", "gamma_b", "residual_ratios_a",
        "residual_ratios_b"}; "layout" says the arrays.
        """
        path = payload_path(image)
        if path is None:
            raise refused("compare", "no image given")

        def answer() -> dict:
            _choice(model_b, list(cait.list_models()), "model_b")  # before any work
            return torch_thread.handler(self._answer)(path, model_b, int(target))

        return _calmly("compare", answer)

    def _answer(self, path: str, model_b: str, target: int) -> dict:
        loaded = self.cache.get(self.default)
        other = self.cache.get(ModelChoice(model_b, random_init=self.default.random_init))
        decoded, _, x = session.model_input(path, loaded.cfg)
        seen, _ = compare_view.compared(loaded, x, decoded.image, other, None, target=None if target == -1 else target)
        return compare_view.numbers(seen, loaded, other)


def _calmly(endpoint: str, compute: Callable[[], dict]) -> dict:
    """An endpoint's answer: a caller's mistake (`InputError`) refused in one line, anything else one line saying
    an internal error happened, with the traceback in the server log."""
    try:
        return compute()
    except InputError as e:
        prefix = "Could not analyse this file: " if isinstance(e, ImageInputError) else ""
        raise refused(endpoint, f"{prefix}{e}") from None
    except Exception:
        log.exception("/%s: internal error", endpoint)
        raise gr.Error(INTERNAL_ERROR.replace("**", ""), print_exception=False) from None
