"""Checks that text given to a model is what the model reads: tokenised the way it was trained, and in its vocabulary.

Two ways a command can turn a file into numbers that look fine and mean nothing:

* **Untokenised text.** Lines are split on whitespace unless ``--tokenizer`` says otherwise, so raw Chinese becomes
  one token per line, cut at the model's character limit (:func:`token_limit`: 8 characters for ``elmokit-zh``, 48
  UTF-8 bytes = 16 Chinese characters for the byte models). :func:`check_tokenisation` counts the tokens that are cut
  at that limit or are a run of 6 or more CJK characters; :attr:`TokenisationCheck.warning` fires above
  :data:`SUSPECT_TOKEN_SHARE` of the tokens and names the ``--tokenizer`` that fixes it.
* **Out-of-vocabulary targets.** ``perplexity`` and ``score`` score every word outside the model's vocabulary as
  ``<UNK>``, one class the model predicts easily, so a file of unknown words gets a *low* perplexity.
  :func:`unk_targets` counts them; :func:`unk_warning` fires above :data:`UNK_WARN_SHARE` of the targets.

The thresholds come from real text (the figures are in docs/reference/checks.md and in
``bench/text_checks.py``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "SUSPECT_TOKEN_SHARE",
    "UNK_WARN_SHARE",
    "CJK_RUN",
    "token_limit",
    "is_cjk",
    "TokenisationCheck",
    "check_tokenisation",
    "unk_targets",
    "unk_warning",
]

#: A tokenisation warning is given when more than this share of the tokens is cut at the model's character limit or
#: is a run of :data:`CJK_RUN` or more CJK characters (``python bench/text_checks.py``). Segmented text stays far
#: below it: UD Chinese GSD (gold words, 123,283 tokens) 0.15 % (123 over 8 characters, 64 runs), the Chinese
#: quickstart's text (jieba / PKU words, 71,610 tokens) 0.05 %; WikiText-2 test and valid and PTB test (533,766 tokens)
#: none over 48 bytes. The same Chinese sentences joined without spaces (raw text) 96.7 % with a limit of 8
#: characters, 96.6 % with 48 bytes.
SUSPECT_TOKEN_SHARE = 0.01

#: A CJK token this long (characters) looks like an unsegmented phrase: 64 of UD Chinese GSD's 101,506 CJK words are.
CJK_RUN = 6

#: ``perplexity`` / ``score`` warn when more than this share of the targets (words + one boundary per sentence and
#: direction) is ``<UNK>`` (``python bench/text_checks.py --model …``). Held-out text of the model's own corpus stays
#: below it: 12.8 % for a 300-step English quickstart model (vocabulary 4,123: the Lee corpus's training words seen
#: twice), 16.2 % for the Chinese one (4,483 words), 8.2 % of the words for ``elmokit-en`` (49,002 words) on
#: WikiText-2 test. Other English text through the quickstart's small vocabulary is above it, 30.4 % (PTB test) and
#: 30.2 % (WikiText-2 test), where the perplexity no longer follows the text (WikiText-2 153.8, PTB 250.9, the model's
#: own held-out text 148.1); raw Chinese (one token a line) is 50 % and scores 71.9 against 216.5 segmented; a line
#: of 5,000 random words is 100 % ``<UNK>`` and scores 36.1 (English) or 21.6 (Chinese model).
UNK_WARN_SHARE = 0.25


def _cli_option(name: str) -> str:
    return f"--tokenizer {name}"


def is_cjk(text: str) -> bool:
    """True when ``text`` holds a CJK ideograph, kana or hangul character (Unicode names CJK / HIRAGANA / KATAKANA /
    HANGUL)."""
    for ch in text:
        if ord(ch) < 0x2E80:
            continue
        if unicodedata.name(ch, "").startswith(("CJK", "HIRAGANA", "KATAKANA", "HANGUL")):
            return True
    return False


def token_limit(config) -> tuple[int, str]:
    """``(n, unit)``: the longest token a model with this :class:`~elmokit.config.ElmoConfig` reads whole — ``C - 2``
    characters of its character vocabulary (``unit="characters"``) or ``C - 2`` UTF-8 bytes (``unit="bytes"``); longer
    tokens are cut to that (see :mod:`elmokit.characters`)."""
    c = config.char_cnn.max_characters_per_token
    return c - 2, ("characters" if config.char_cnn.char_vocab_size is not None else "bytes")


def _length(token: str, unit: str) -> int:
    return len(token) if unit == "characters" else len(token.encode("utf-8", "surrogatepass"))


@dataclass
class TokenisationCheck:
    """What :func:`check_tokenisation` found. ``tokens``: tokens examined; ``cut``: longer than ``limit`` ``unit``;
    ``cjk_runs``: CJK tokens of :data:`CJK_RUN` or more characters (not cut); ``cjk``: how many of the suspect tokens
    hold CJK characters; ``example``: ``(line, token)`` of the first suspect token; ``tokenizer``: the tokenizer the
    lines went through."""

    tokens: int
    cut: int
    cjk_runs: int
    cjk: int
    limit: int
    unit: str
    tokenizer: str
    example: tuple[int, str] | None = None

    @property
    def suspect(self) -> int:
        return self.cut + self.cjk_runs

    @property
    def share(self) -> float:
        """Suspect tokens / tokens (0 for no tokens)."""
        return self.suspect / self.tokens if self.tokens else 0.0

    def fix(self, option: Callable[[str], str] = _cli_option) -> str:
        """What to do: jieba for Chinese, spaces between the words otherwise. ``option`` words the choice of a
        tokenizer (default ``"--tokenizer NAME"``)."""
        if self.cjk * 2 >= self.suspect and self.tokenizer != "jieba":
            return f"segment it: {option('jieba')} (Chinese word segmentation), or separate the words by spaces"
        if self.tokenizer == "whitespace":
            return f"separate the words by spaces (pre-tokenised text), or {option('moses')} for raw English"
        return "separate the words by spaces (pre-tokenised text)"

    def warning(self, option: Callable[[str], str] = _cli_option) -> str | None:
        """One line when :attr:`share` exceeds :data:`SUSPECT_TOKEN_SHARE`, else ``None`` (``option`` as
        :meth:`fix`)."""
        if self.share <= SUSPECT_TOKEN_SHARE:
            return None
        line, token = self.example or (0, "")
        shown = token if len(token) <= 24 else token[:24] + "…"
        parts = []
        if self.cut:
            parts.append(f"{self.cut} cut at the model's limit of {self.limit} {self.unit}")
        if self.cjk_runs:
            parts.append(f"{self.cjk_runs} runs of {CJK_RUN}+ CJK characters")
        return (
            f"the lines look untokenised for this model: {100 * self.share:.1f} % of the {self.tokens} tokens "
            f"({', '.join(parts)}; e.g. line {line}: {shown!r}) are whole phrases, which the model reads as one "
            f"word; {self.fix(option)}"
        )


def check_tokenisation(
    lines: Iterable[tuple[int, Sequence[str]]], config, tokenizer: str = "whitespace"
) -> TokenisationCheck:
    """Count the tokens of ``lines`` (``(line number, tokens)``) that a model with ``config`` cannot read as words:
    longer than :func:`token_limit` (cut), or CJK runs of :data:`CJK_RUN` or more characters (unsegmented
    Chinese/Japanese). ``tokenizer`` is the one the lines went through (named in the advice)."""
    limit, unit = token_limit(config)
    tokens = cut = runs = cjk = 0
    example = None
    for number, sentence in lines:
        for token in sentence:
            tokens += 1
            too_long = _length(token, unit) > limit
            run = not too_long and len(token) >= CJK_RUN and is_cjk(token)
            if too_long or run:
                cut += too_long
                runs += run
                cjk += is_cjk(token)
                if example is None:
                    example = (number, token)
    return TokenisationCheck(tokens, cut, runs, cjk, limit, unit, tokenizer, example)


def unk_targets(vocab, sentences: Iterable[Sequence[str]]) -> tuple[int, int]:
    """``(unknown, targets)`` per direction: the words of ``sentences`` outside ``vocab`` (scored as ``<UNK>``; a
    literal ``<UNK>`` counts too), and the targets one direction scores — each sentence's words plus one boundary, as
    :meth:`elmokit.pretraining.BidirectionalLM.sentence_nll` scores them (an empty sentence is one target)."""
    unk_id = vocab.unk_id
    unknown = targets = 0
    for sentence in sentences:
        ids = vocab.encode(sentence) if sentence else []
        unknown += sum(1 for i in ids if i == unk_id)
        targets += len(ids) + 1
    return unknown, targets


def unk_warning(unknown: int, targets: int, vocab_size: int) -> str | None:
    """One line when more than :data:`UNK_WARN_SHARE` of the targets are ``<UNK>``, else ``None``."""
    if not targets or unknown / targets <= UNK_WARN_SHARE:
        return None
    return (
        f"{100 * unknown / targets:.1f} % of the targets ({unknown} of {targets}) are <UNK>, words outside the "
        f"model's vocabulary of {vocab_size}, all scored as that one easy word: the figure says little about "
        f"this text (held-out text of a model's own corpus stays under {100 * UNK_WARN_SHARE:.0f} %: check the "
        "language, the tokenisation and the model)"
    )
