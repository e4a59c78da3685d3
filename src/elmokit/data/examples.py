"""The bundled example sentences: "bank" (English) and 苹果 (Chinese), two senses each, with the word's position.

One home for them: the quickstart recipes probe their models with them (:mod:`elmokit.recipes.quickstart.en`,
:mod:`elmokit.recipes.quickstart.zh`), and ``elmokit serve`` offers them on its page (``GET /examples``,
:mod:`elmokit.serving.app`), so the library reads them here rather than from a recipe.

Each row is ``(sense, tokens, index)``: the sense label, the sentence as a token list, and the index of the word in it
(it occurs once). All hand-written; none occurs in the quickstarts' training text (the tests check it).
"""

from __future__ import annotations

__all__ = ["BANK_SENTENCES", "APPLE_TEXTS", "APPLE_SENTENCES"]

#: (sense, tokens, index of "bank"): three sentences per sense, so that the comparison is between means over several
#: pairs (3 river pairs + 3 money pairs within a sense, 9 pairs across) rather than single cosines.
BANK_SENTENCES = [
    ("river", "They walked along the bank of the river .".split(), 4),
    ("river", "The boat drifted to the muddy bank of the stream .".split(), 6),
    ("river", "Fishermen sat on the grassy bank beside the water .".split(), 5),
    ("money", "She took the money to the bank to open an account .".split(), 6),
    ("money", "The bank raised interest rates on home loans .".split(), 1),
    ("money", "He borrowed money from the bank to buy a house .".split(), 5),
]

#: (sense, raw text) of the 苹果 probes: four sentences per sense (the fruit, the company), in the order of
#: :data:`APPLE_SENTENCES`.
APPLE_TEXTS = [
    ("fruit", "我每天早上吃一个苹果。"),
    ("fruit", "妈妈在超市买了一袋苹果和两斤香蕉。"),
    ("fruit", "这个苹果又红又甜，水分很多。"),
    ("fruit", "秋天到了，果园里的苹果都熟了。"),
    ("company", "昨天的苹果发布会推出了新款手机。"),
    ("company", "苹果的屏幕比这台笔记本的好多了。"),
    ("company", "我一直用苹果的电脑，系统很流畅。"),
    ("company", "这款笔记本的键盘很像苹果的设计。"),
]

#: (sense, tokens, index of 苹果): :data:`APPLE_TEXTS` as jieba segments them (default dictionary, precise mode, HMM;
#: ``elmokit.recipes.quickstart.zh.segment(text) == [tokens]``, a test checks it), so that the Chinese quickstart's
#: model reads them as it read its reviews; 苹果 is one word token in each.
APPLE_SENTENCES = [
    ("fruit", "我 每天 早上 吃 一个 苹果 。".split(), 5),
    ("fruit", "妈妈 在 超市 买 了 一袋 苹果 和 两斤 香蕉 。".split(), 6),
    ("fruit", "这个 苹果 又 红 又 甜 ， 水分 很多 。".split(), 1),
    ("fruit", "秋天 到 了 ， 果园 里 的 苹果 都 熟 了 。".split(), 7),
    ("company", "昨天 的 苹果 发布会 推出 了 新款手机 。".split(), 2),
    ("company", "苹果 的 屏幕 比 这台 笔记本 的 好多 了 。".split(), 0),
    ("company", "我 一直 用 苹果 的 电脑 ， 系统 很 流畅 。".split(), 3),
    ("company", "这 款 笔记本 的 键盘 很 像 苹果 的 设计 。".split(), 7),
]
