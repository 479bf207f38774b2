"""Chat model backends that the data pipeline asks for kernels and repairs.

Two backends behind one small protocol, so `data_gen` does not care where the model runs:

* `OpenAIChatModel`: any OpenAI-compatible server (vLLM, SGLang, ...), through the official
  `openai` client, whose own retry/backoff handles transient 5xx/429/connection errors.
* `LocalHFChatModel`: a local Hugging Face model directory, loaded offline with transformers.

Failures that a user must fix (wrong URL, server down, unknown model, missing directory) surface
as `EndpointError` with a one-line message, so the CLI can print it instead of a traceback.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": ...}

_MAX_REASON_CHARS = 300

# Local models load one at a time, whichever thread asks. A first import of transformers' lazy
# submodules from two threads at once is not safe (one thread sees a half-initialised module and
# gets "cannot import name 'AutoModelForCausalLM'"), and loading two checkpoints at once would
# only double the peak memory: generation, not loading, is what runs concurrently.
_LOCAL_LOAD_LOCK = threading.Lock()
_TRAIN_PACKAGES = ("torch", "transformers")


@runtime_checkable
class ChatModel(Protocol):
    """What the pipeline needs from a model: a name for the records and one blocking call."""

    name: str

    def complete(
        self,
        messages: list[Message],
        *,
        temperature: float = 0.0,
        max_tokens: int = 4096,
        seed: int | None = None,
    ) -> str: ...


class EndpointError(RuntimeError):
    """The model cannot be used (unreachable, unknown, unloadable); the message is one human line."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message, limit=None))


def _one_line(text: str, limit: int | None = _MAX_REASON_CHARS) -> str:
    """Collapse whitespace so server error bodies and tracebacks cannot break the one-line promise."""
    flat = " ".join(str(text).split())
    if limit is not None and len(flat) > limit:
        flat = flat[: limit - 3] + "..."
    return flat


def _api_error_reason(err: BaseException) -> str:
    """A short reason for an openai exception: HTTP status and server message, or the socket cause."""
    import openai

    if isinstance(err, openai.APIStatusError):
        detail = err.message
        body = err.body
        if isinstance(body, dict):
            inner = body.get("error", body)
            if isinstance(inner, dict) and inner.get("message"):
                detail = str(inner["message"])
            elif isinstance(body.get("message"), str):
                detail = body["message"]
        return _one_line(f"HTTP {err.status_code}: {detail}")
    if isinstance(err, openai.APITimeoutError):
        return "request timed out"
    if isinstance(err, openai.APIConnectionError):
        # The client says only "Connection error."; the useful part (refused, DNS) is the cause.
        cause = err.__cause__
        while cause is not None and cause.__cause__ is not None and not str(cause):
            cause = cause.__cause__
        return _one_line(f"connection error ({cause})" if cause and str(cause) else "connection error")
    return _one_line(f"{type(err).__name__}: {err}")


class OpenAIChatModel:
    """A model behind an OpenAI-compatible HTTP endpoint; one shared client serves all threads."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
    ) -> None:
        import openai

        self.base_url = base_url
        self.model = model
        self.name = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        # Local servers ignore the key, but the client refuses to start without one.
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        # httpx clients are thread-safe, so one openai client is shared by all worker threads.
        self._client = openai.OpenAI(
            base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries
        )

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model!r})"

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Fail fast, before a long run starts, if the server is down or does not serve the model.

        One `GET /models` with no retries, so a wrong URL costs seconds, not the client's backoff.
        """
        import openai

        client = self._client.with_options(timeout=timeout_s, max_retries=0)
        try:
            page = client.models.list()
        except openai.APIError as err:
            raise EndpointError(
                f"cannot reach the model endpoint {self.base_url}: {_api_error_reason(err)}"
            ) from err
        served = [m.id for m in page.data]
        if self.model not in served:
            available = ", ".join(served) if served else "none"
            raise EndpointError(
                f"model {self.model!r} is not served by {self.base_url}; available: {available}"
            )

    def complete(
        self,
        messages: list[Message],
        *,
        temperature: float = 0.0,
        max_tokens: int = 4096,
        seed: int | None = None,
    ) -> str:
        """One chat completion; transient failures are retried by the client (`max_retries`)."""
        import openai

        kwargs: dict[str, Any] = {}
        if seed is not None:  # not every server accepts `seed: null`
            kwargs["seed"] = seed
        try:
            resp = self._client.chat.completions.create(
                model=self.model,
                messages=messages,  # type: ignore[arg-type]
                temperature=temperature,
                max_tokens=max_tokens,
                **kwargs,
            )
        except openai.APIError as err:
            raise EndpointError(
                f"model {self.model!r} at {self.base_url} failed: {_api_error_reason(err)}"
            ) from err
        if not resp.choices:
            raise EndpointError(f"model {self.model!r} at {self.base_url} returned no choices")
        return resp.choices[0].message.content or ""


class LocalHFChatModel:
    """A Hugging Face model directory run in-process; no network, one generation at a time."""

    def __init__(self, path: str | os.PathLike[str], adapter: str | os.PathLike[str] | None = None) -> None:
        self.path = str(path)
        self.adapter = str(adapter) if adapter is not None else None
        self.name = Path(self.path).name + (f"+{Path(self.adapter).name}" if self.adapter else "")
        # generate() on one model from several threads is not safe and would not be faster.
        self._lock = threading.Lock()

        if not Path(self.path).is_dir():
            raise EndpointError(f"cannot load model {self.path} offline: no such directory")
        if self.adapter is not None and not Path(self.adapter).is_dir():
            raise EndpointError(
                f"cannot load model {self.path} offline: adapter {self.adapter} is not a directory"
            )
        with _LOCAL_LOAD_LOCK:
            self._load()
        if getattr(self._tokenizer, "chat_template", None) is None:
            raise EndpointError(
                f"cannot load model {self.path} offline: its tokenizer has no chat template"
            )

    def _load(self) -> None:
        """Tokenizer, model and adapter; called under `_LOCAL_LOAD_LOCK`."""
        try:
            # Heavy imports here, so importing this module (and the CLI) stays cheap.
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as err:
            raise EndpointError(f"cannot load model {self.path} offline: {_import_failure(err)}") from err

        try:
            self._torch = torch
            self._tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                self.path, local_files_only=True, torch_dtype="auto"
            )
            if self.adapter is not None:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, self.adapter)
            if torch.cuda.is_available():
                model = model.to("cuda")
            model.eval()
            self._model = model
        except Exception as err:  # OSError, ValueError, ImportError (peft): all mean "cannot load"
            raise EndpointError(
                f"cannot load model {self.path} offline: {type(err).__name__}: {_one_line(str(err))}"
            ) from err

    def __repr__(self) -> str:
        return f"LocalHFChatModel(path={self.path!r}, adapter={self.adapter!r})"

    def complete(
        self,
        messages: list[Message],
        *,
        temperature: float = 0.0,
        max_tokens: int = 4096,
        seed: int | None = None,
    ) -> str:
        """Generate with the model's own chat template; returns only the new text."""
        torch = self._torch
        tok = self._tokenizer
        # Render to text and tokenize separately: apply_chat_template(tokenize=True)'s return type
        # changed across transformers versions (tensor vs BatchEncoding).
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = tok(prompt, return_tensors="pt", add_special_tokens=False)
        device = next(self._model.parameters()).device
        inputs = {k: v.to(device) for k, v in inputs.items()}
        gen_kwargs: dict[str, Any] = {"max_new_tokens": max_tokens}
        if temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=temperature)
        else:
            gen_kwargs.update(do_sample=False)
        if tok.pad_token_id is None and tok.eos_token_id is not None:
            gen_kwargs["pad_token_id"] = tok.eos_token_id
        with self._lock, torch.inference_mode():
            if seed is not None:  # under the lock: the global RNG is shared by all callers
                torch.manual_seed(seed)
            out = self._model.generate(**inputs, **gen_kwargs)
        new_tokens = out[0, inputs["input_ids"].shape[1] :]
        return tok.decode(new_tokens, skip_special_tokens=True)


def _import_failure(err: ImportError) -> str:
    """Why torch/transformers did not import: a missing package says to install it; any other
    import error (a broken install, a version clash) is reported as itself."""
    if isinstance(err, ModuleNotFoundError) and err.name in _TRAIN_PACKAGES:
        return f"{err} (install the train extra: pip install -e '.[train]')"
    return f"{type(err).__name__}: {_one_line(str(err))}"


def make_chat_model(spec: str, *, base_url: str | None, api_key: str | None = None,
                    adapter: str | None = None) -> ChatModel:
    """The CLI's `--model`/`--base-url` to a backend: a served model name (probed at once, so a
    dead endpoint fails in seconds, before any work), or a local directory (plus a PEFT adapter)."""
    if base_url:
        model = OpenAIChatModel(base_url, spec, api_key=api_key)
        model.check_reachable()
        return model
    if Path(spec).is_dir():
        return LocalHFChatModel(spec, adapter=adapter)
    raise EndpointError(
        f"model {spec!r} is neither a local directory nor served: "
        "pass --base-url for an OpenAI-compatible endpoint"
    )
