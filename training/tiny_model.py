"""A tiny random Llama-style chat model with a tokenizer trained offline: the smoke-test model.

Nothing is downloaded and no weights we did not make are shipped: the tokenizer is a byte-level
BPE trained here on the texts given (a Fixit dataset's conversations), the model is randomly
initialized. The chat template is ChatML, and `<|im_end|>` ends a turn and is the EOS token,
so a model trained on it learns to stop.

    python -m training.tiny_model --out runs/tiny-model --dataset datasets/fixit-mutation
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

END_OF_TURN = "<|im_end|>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", END_OF_TURN, "<|pad|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2000):
    """A byte-level BPE tokenizer, trained offline on `texts`, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=None, eos_token=END_OF_TURN,
                                        pad_token="<|pad|>", unk_token=None)
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(out: Path, texts: Iterable[str], *, vocab_size: int = 2000, hidden: int = 64,
                     layers: int = 2, heads: int = 4, seed: int = 0, sliding_window: int | None = None) -> Path:
    """Write a random LlamaForCausalLM and its tokenizer to `out`; returns `out`.

    With `sliding_window`, the model is a MistralForCausalLM instead (Llama's architecture, but each
    token attends only to the last `sliding_window` tokens): what it learns then depends only on
    local context, so a memorised answer does not hinge on the details of a long prompt.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    tokenizer = train_tokenizer(texts, vocab_size)
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                  max_position_embeddings=8192, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=True,
                  # large enough that logits can be sharp: with the default 0.02, a frozen
                  # embedding behind RMSNorm caps LoRA training at a near-uniform softmax
                  initializer_range=0.25)
    if sliding_window is None:
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = MistralForCausalLM(MistralConfig(**common, head_dim=hidden // heads,
                                                 sliding_window=sliding_window))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@dataclass
class TinyModelArguments:
    """The config keys of a smoke run's model (training.sft, training.rl): built at
    model_name_or_path on first use when `build_tiny_model` is set."""

    build_tiny_model: bool = field(default=False, metadata={
        "help": "if model_name_or_path does not exist, build a tiny random model and an offline-trained "
                "tokenizer there (smoke runs only)"})
    tiny_hidden_size: int = field(default=64, metadata={
        "help": "hidden size of the model build_tiny_model builds (MLP width is 4x)"})
    tiny_num_layers: int = field(default=2, metadata={"help": "decoder layers of the tiny model"})
    tiny_num_heads: int = field(default=4, metadata={"help": "attention heads of the tiny model"})
    tiny_sliding_window: int | None = field(default=None, metadata={
        "help": "if set, the tiny model attends only to this many most recent tokens (a Mistral-style "
                "sliding window): its answers then depend on the prompt's last few tokens only"})

    def build_if_asked(self, name: str, texts: Callable[[], list[str]]) -> None:
        """Build the tiny model at `name` if asked to and nothing is there yet; `texts` (called
        only then) are what its tokenizer is trained on."""
        if self.build_tiny_model and not Path(name).exists():
            build_tiny_model(Path(name), texts(), hidden=self.tiny_hidden_size, layers=self.tiny_num_layers,
                             heads=self.tiny_num_heads, sliding_window=self.tiny_sliding_window)


def dataset_texts(path: str | Path) -> list[str]:
    """Every message of a Fixit dataset folder (all splits), the tokenizer's training text."""
    import datasets

    ds = datasets.load_dataset(str(path))
    return [m["content"] for split in ds.values() for row in split for m in row["messages"]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/tiny-model"))
    parser.add_argument("--dataset", default="datasets/fixit-mutation")
    args = parser.parse_args(argv)
    print(build_tiny_model(args.out, dataset_texts(args.dataset)))


if __name__ == "__main__":
    main()
