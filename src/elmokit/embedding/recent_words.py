"""The layer-0 vectors of recently seen words, kept for later batches: a bounded least-recently-used cache.

ELMo's layer 0 is context-free: a word's vector comes from its characters alone (char CNN → highway → projection,
Peters et al. 2018 §3.4; bilm-tf's ``BidirectionalLanguageModel`` token encoder), so the same word always gets the
same vector and a long-running embedder — the HTTP server, a stream of files — can keep the vectors of the words it
has seen and skip the character CNN for them next time. AllenNLP's ``vocab_to_cache`` (here
:class:`~elmokit.TokenVectorCache`, ``Embedder(vocab_to_cache=…)``) does the same for a word list fixed in advance;
this cache fills itself from the text it is given, the least recently used word leaving first when it is full.

Values: a word's vector computed among one batch's distinct words and reused in another batch equals the one the
character CNN would give there to float rounding (a matrix product over another number of rows), within
:class:`~elmokit.Embedder`'s documented batch-independence bound. The cache empties itself when a token-encoder
weight changes (the same tracking as :mod:`elmokit.modules.derived`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from elmokit.checks import positive_int
from elmokit.modules.derived import same_sources, sources_key

__all__ = ["RecentWordVectors"]


class RecentWordVectors:
    """At most ``capacity`` words' layer-0 vectors, least recently used out first.

    Args:
        capacity: words kept (> 0). The storage, ``capacity × width`` float32 values (4 bytes each: 26 MB for 50,000
            words at P = 128, 102 MB at P = 512), is allocated at construction.
        width: the vector width P (the model's projection size).
        sources: the token encoder's parameters: when one of them changes (an in-place update, an optimiser step,
            ``load_state_dict``) every kept vector is dropped.
        device: where the vectors are kept (the model's device).

    :meth:`fill` copies the kept vectors of some words into a tensor and says which words it did not hold;
    :meth:`store` keeps newly encoded ones. Both take a lock, so one instance may serve several threads. ``hits``
    and ``misses`` count the words :meth:`fill` found and did not find (distinct words per call).

    Raises:
        UsageError: (from :func:`~elmokit.checks.positive_int`) a capacity that is not a positive int.
    """

    def __init__(
        self, capacity: int, width: int, sources: Sequence[torch.Tensor], device: torch.device | str = "cpu"
    ) -> None:
        self.capacity = positive_int("recent_word_cache", capacity)
        self.vectors = torch.zeros((self.capacity, width), dtype=torch.float32, device=device)
        self._sources = tuple(sources)
        self._key = sources_key(self._sources)
        self._slots: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._slots)

    def clear(self) -> None:
        """Forget every word (the storage is kept)."""
        with self._lock:
            self._slots.clear()

    def _check_sources(self) -> None:
        """Drop everything when a token-encoder weight changed (called with the lock held)."""
        key = sources_key(self._sources)
        if key is None or self._key is None or not same_sources(key, self._key):
            self._slots.clear()
            self._key = key

    def fill(self, words: Sequence[str], out: torch.Tensor, rows: Sequence[int]) -> list[int]:
        """Copy the vectors of the ``words`` held here into ``out[rows[i]]`` (``out``: (N, P) float; ``rows[i]`` is
        ``words[i]``'s row) and mark them recently used; returns the positions i of the words not held."""
        found_rows: list[int] = []
        found_slots: list[int] = []
        missing: list[int] = []
        with self._lock:
            self._check_sources()
            slots = self._slots
            for i, word in enumerate(words):
                slot = slots.get(word)
                if slot is None:
                    missing.append(i)
                else:
                    slots.move_to_end(word)
                    found_rows.append(rows[i])
                    found_slots.append(slot)
            if found_rows:
                index = torch.tensor(found_slots, dtype=torch.long, device=self.vectors.device)
                target = torch.tensor(found_rows, dtype=torch.long, device=out.device)
                out[target] = self.vectors[index].to(device=out.device, dtype=out.dtype)
            self.hits += len(found_rows)
            self.misses += len(missing)
        return missing

    def store(self, words: Sequence[str], vectors: torch.Tensor) -> None:
        """Keep ``vectors[i]`` ((len(words), P) float) as ``words[i]``'s vector, evicting the least recently used
        words when full. Words already held are left as they are. Only the last ``capacity`` words of a call can
        stay."""
        if len(words) == 0:
            return
        with self._lock:
            self._check_sources()
            slots = self._slots
            rows: list[int] = []
            places: list[int] = []
            start = max(0, len(words) - self.capacity)
            for i in range(start, len(words)):
                word = words[i]
                if word in slots:
                    continue
                if len(slots) < self.capacity:
                    slot = len(slots)
                else:
                    _, slot = slots.popitem(last=False)
                slots[word] = slot
                rows.append(i)
                places.append(slot)
            if rows:
                source = vectors[torch.tensor(rows, dtype=torch.long, device=vectors.device)]
                index = torch.tensor(places, dtype=torch.long, device=self.vectors.device)
                with torch.no_grad():
                    self.vectors[index] = source.to(device=self.vectors.device, dtype=torch.float32)
