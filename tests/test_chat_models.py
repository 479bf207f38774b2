"""Chat model backends against a real (fake) OpenAI-compatible server over real sockets."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from chat.models import (
    ChatModel,
    EndpointError,
    LocalHFChatModel,
    OpenAIChatModel,
    make_chat_model,
)
from tests.conftest import require_module
from tests.fake_openai_server import FakeOpenAIServer


def _last_user(messages: list[dict], model: str) -> str:
    """Echo the last user message, so each caller can recognize its own answer."""
    user = [m["content"] for m in messages if m["role"] == "user"]
    return f"{model} says: {user[-1] if user else ''}"


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_complete_returns_canned_text_and_sends_messages() -> None:
    messages = [
        {"role": "system", "content": "You write Pallas kernels."},
        {"role": "user", "content": "add two vectors"},
    ]
    with FakeOpenAIServer(lambda msgs, model: "def kernel(): pass") as server:
        model = OpenAIChatModel(server.base_url, "fake-model", timeout_s=5, max_retries=0)
        assert isinstance(model, ChatModel)
        assert model.name == "fake-model"
        model.check_reachable()
        text = model.complete(messages, temperature=0.7, max_tokens=123, seed=7)
    assert text == "def kernel(): pass"
    assert len(server.requests) == 1
    body = server.requests[0]
    assert body["messages"] == messages
    assert body["model"] == "fake-model"
    assert body["temperature"] == 0.7
    assert body["max_tokens"] == 123
    assert body["seed"] == 7


def test_seed_omitted_when_none() -> None:
    with FakeOpenAIServer(lambda msgs, model: "ok") as server:
        model = OpenAIChatModel(server.base_url, "fake-model", timeout_s=5, max_retries=0)
        assert model.complete([{"role": "user", "content": "hi"}]) == "ok"
    assert "seed" not in server.requests[0]


def test_server_errors_are_retried_by_the_client() -> None:
    with FakeOpenAIServer(_last_user, fail_first=2) as server:
        model = OpenAIChatModel(server.base_url, "fake-model", timeout_s=5, max_retries=3)
        start = time.monotonic()
        text = model.complete([{"role": "user", "content": "again"}])
        elapsed = time.monotonic() - start
    assert text == "fake-model says: again"
    assert len(server.requests) == 3  # two 500s, then the answer
    # The client's backoff: ~0.5 s then ~1 s (minus up to 25% jitter) with no Retry-After header.
    assert elapsed < 5, elapsed


def test_retries_exhausted_become_endpoint_error() -> None:
    with FakeOpenAIServer(_last_user, fail_first=10) as server:
        model = OpenAIChatModel(server.base_url, "fake-model", timeout_s=5, max_retries=1)
        with pytest.raises(EndpointError) as info:
            model.complete([{"role": "user", "content": "x"}])
    assert len(server.requests) == 2
    msg = str(info.value)
    assert "\n" not in msg
    assert "HTTP 500" in msg and "injected failure" in msg


def test_check_reachable_fails_fast_on_closed_port() -> None:
    base_url = f"http://127.0.0.1:{_closed_port()}/v1"
    model = OpenAIChatModel(base_url, "fake-model", timeout_s=60, max_retries=4)
    start = time.monotonic()
    with pytest.raises(EndpointError) as info:
        model.check_reachable(timeout_s=2)
    elapsed = time.monotonic() - start
    assert elapsed < 10, elapsed
    msg = str(info.value)
    assert msg.startswith(f"cannot reach the model endpoint {base_url}: ")
    assert "\n" not in msg


def test_complete_on_closed_port_is_endpoint_error() -> None:
    base_url = f"http://127.0.0.1:{_closed_port()}/v1"
    model = OpenAIChatModel(base_url, "fake-model", timeout_s=2, max_retries=0)
    with pytest.raises(EndpointError, match="connection error"):
        model.complete([{"role": "user", "content": "x"}])


def test_check_reachable_names_served_models_for_unknown_model() -> None:
    with FakeOpenAIServer(_last_user, models=("qwen-coder", "llama")) as server:
        model = OpenAIChatModel(server.base_url, "no-such-model", timeout_s=5, max_retries=0)
        with pytest.raises(EndpointError) as info:
            model.check_reachable()
        msg = str(info.value)
        assert "'no-such-model'" in msg
        assert "qwen-coder" in msg and "llama" in msg
        # And a completion for it is a one-line EndpointError too, not an openai exception.
        with pytest.raises(EndpointError, match="HTTP 404"):
            model.complete([{"role": "user", "content": "x"}])


def test_concurrent_calls_get_their_own_answers() -> None:
    with FakeOpenAIServer(_last_user) as server:
        model = OpenAIChatModel(server.base_url, "fake-model", timeout_s=10, max_retries=0)
        barrier = threading.Barrier(8)

        def ask(i: int) -> str:
            barrier.wait(timeout=10)  # all eight in flight together
            return model.complete([{"role": "user", "content": f"question {i}"}])

        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(ask, range(8)))
    assert answers == [f"fake-model says: question {i}" for i in range(8)]
    assert len(server.requests) == 8


def test_make_chat_model_with_base_url_is_openai() -> None:
    with FakeOpenAIServer(_last_user) as server:
        model = make_chat_model("fake-model", base_url=server.base_url)
        assert isinstance(model, OpenAIChatModel)
        assert model.complete([{"role": "user", "content": "hi"}]) == "fake-model says: hi"


def test_make_chat_model_missing_dir_without_base_url(tmp_path) -> None:
    spec = str(tmp_path / "no-such-model")
    with pytest.raises(EndpointError) as info:
        make_chat_model(spec, base_url=None)
    assert str(info.value) == (
        f"model {spec!r} is neither a local directory nor served: "
        "pass --base-url for an OpenAI-compatible endpoint"
    )


def test_local_model_missing_dir_is_endpoint_error(tmp_path) -> None:
    path = tmp_path / "missing"
    with pytest.raises(EndpointError, match=f"cannot load model {path} offline: "):
        LocalHFChatModel(path)


def test_local_model_unloadable_dir_is_endpoint_error(tmp_path) -> None:
    """An empty directory fails to load, with or without transformers installed."""
    with pytest.raises(EndpointError) as info:
        make_chat_model(str(tmp_path), base_url=None)
    msg = str(info.value)
    assert msg.startswith(f"cannot load model {tmp_path} offline: ")
    assert "\n" not in msg


def test_local_model_generates_offline(tmp_path) -> None:
    """A tiny random Llama with a word-level tokenizer, built here: nothing is downloaded."""
    for module in ("torch", "transformers", "tokenizers"):
        require_module(module, "pip install -e '.[train]'")
    import tokenizers
    import transformers

    words = ["<pad>", "<eos>", "<unk>", "user", "assistant", "system", ":", "add", "two", "vectors"]
    vocab = {w: i for i, w in enumerate(words)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant : {% endif %}"
    )
    model_dir = tmp_path / "tiny"
    tok.save_pretrained(model_dir)
    config = transformers.LlamaConfig(
        vocab_size=len(words),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(model_dir)

    model = make_chat_model(str(model_dir), base_url=None)
    assert isinstance(model, LocalHFChatModel)
    msgs = [{"role": "user", "content": "add two vectors"}]
    greedy = model.complete(msgs, max_tokens=5)
    assert isinstance(greedy, str)
    assert "<eos>" not in greedy and "<pad>" not in greedy
    assert model.complete(msgs, max_tokens=5) == greedy  # greedy is deterministic
    assert model.complete(msgs, temperature=1.0, max_tokens=5, seed=3) == model.complete(
        msgs, temperature=1.0, max_tokens=5, seed=3
    )


def test_check_reachable_times_out_on_silent_server() -> None:
    """A server that accepts connections but never answers (a hung vLLM) costs timeout_s, once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes the handshake; nobody ever reads or replies
        base_url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        model = OpenAIChatModel(base_url, "fake-model", timeout_s=60, max_retries=4)
        start = time.monotonic()
        with pytest.raises(EndpointError, match="timed out"):
            model.check_reachable(timeout_s=1)
        elapsed = time.monotonic() - start
    assert elapsed < 5, elapsed
