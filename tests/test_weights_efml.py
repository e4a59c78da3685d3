"""Reading ELMoForManyLangs folders: the architecture fallback, and each damaged or foreign file refused in one line
naming it (a pickle that would run code is refused without running it)."""

from __future__ import annotations

import json
import logging
import os
import pickletools
import shutil
import zipfile

import pytest
import torch

from conftest import REPO_ROOT
from elmokit import batch_to_ids, load_pretrained_bilm
from elmokit.cli import main as cli_main
from elmokit.config import ElmoConfig
from elmokit.errors import ConfigError, InputError, MissingFileError, UsageError, WeightsError
from elmokit.modules.bilm import BiLM
from elmokit.weights.efml import SHIPPED_ARCHITECTURES, load_efml
from elmokit.weights.efml_vocab import read_dic

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "efml"


@pytest.fixture
def folder(tmp_path):
    dst = tmp_path / "efml"
    shutil.copytree(FIXTURE, dst)
    return dst


def _one_line_error(kind, folder, *needles):
    with pytest.raises(kind) as info:
        load_pretrained_bilm(folder)
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert str(needle) in message, message
    return message


def _set_config_path(folder, value):
    options = json.loads((folder / "config.json").read_text())
    options["config_path"] = value
    (folder / "config.json").write_text(json.dumps(options))


class _RunsACommand:
    """Pickles as a call to os.system: loading it without weights_only would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["encoder.pkl", "token_embedder.pkl"])
def test_a_pickle_that_would_run_code_is_refused_unrun(folder, tmp_path, name):
    marker = tmp_path / "ran"
    torch.save({"forward_layer_0.input_linearity.weight": _RunsACommand(marker)}, folder / name)
    _one_line_error(WeightsError, folder, folder / name, "needs more than tensors", "refused")
    assert not marker.exists()
    assert _calls_os_system(folder / name)  # the pickle is live (read by its opcodes, never unpickled here)


def _calls_os_system(path) -> bool:
    """Whether the torch file's pickle imports os.system (``posix``/``nt`` ``system``) and calls it (REDUCE)."""
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
    names = [arg for _, arg in ops if isinstance(arg, str)]
    imported = any(op == "GLOBAL" and str(arg).split()[-1] == "system" for op, arg in ops) or any(
        a in ("posix", "nt", "os") and b == "system" for a, b in zip(names, names[1:])
    )
    return imported and any(op == "REDUCE" for op, _ in ops)


@pytest.mark.parametrize("name", ["char.dic", "word.dic", "encoder.pkl", "token_embedder.pkl", "config.json"])
def test_a_missing_file_is_named(folder, name):
    (folder / name).unlink()
    _one_line_error(MissingFileError, folder, folder / name, "not found")


def test_a_dic_whose_size_disagrees_with_the_tensors_is_refused(folder):
    lines = (folder / "word.dic").read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "word.dic").write_text("".join(lines[:-1]), encoding="utf-8")
    _one_line_error(WeightsError, folder, folder / "word.dic", "1103 entries", "token_embedder.pkl", "1104 rows")
    (folder / "word.dic").write_text("".join(lines), encoding="utf-8")
    chars = (folder / "char.dic").read_text(encoding="utf-8")
    (folder / "char.dic").write_text(chars + "\u00e9\u00e9\t701\n", encoding="utf-8")
    _one_line_error(WeightsError, folder, folder / "char.dic", "702 entries", "701 rows")


def test_a_bad_dic_line_is_named(folder):
    with open(folder / "char.dic", "a", encoding="utf-8") as fh:
        fh.write("a\tb\tc\n")
    n = len((folder / "char.dic").read_text(encoding="utf-8").splitlines())
    _one_line_error(WeightsError, folder, f"{folder / 'char.dic'}:{n}", "token<TAB>id")


def test_dic_files_are_read_as_efml_reads_them(tmp_path):
    path = tmp_path / "x.dic"
    path.write_text("<oov>\t0\n\u3000\t1\n\t2\nab\t3\n", encoding="utf-8")  # whitespace tokens → "\u3000", last wins
    assert read_dic(path) == {"<oov>": 0, "\u3000": 2, "ab": 3}


def test_a_truncated_pkl_is_refused(folder):
    data = (folder / "encoder.pkl").read_bytes()
    (folder / "encoder.pkl").write_bytes(data[: len(data) // 2])
    _one_line_error(WeightsError, folder, folder / "encoder.pkl", "not a readable torch file")


def test_config_path_is_tried_as_given_then_in_the_folder(folder, caplog):
    _set_config_path(folder, "small_arch.json")  # relative to the folder: found as given
    with caplog.at_level(logging.WARNING, logger="elmokit.weights.efml"):
        model = load_efml(folder)
    assert not caplog.records and model.config.extra["efml"]["architecture"].endswith("(config.json's config_path)")
    _set_config_path(folder, "/home/author/models/small_arch.json")
    with caplog.at_level(logging.WARNING, logger="elmokit.weights.efml"):
        model = load_efml(folder)
    assert "config_path /home/author/models/small_arch.json is not there" in caplog.text
    assert model.config.extra["efml"]["architecture"].startswith(str(folder / "small_arch.json"))


def test_a_config_path_that_is_not_a_path_is_named(folder):
    _set_config_path(folder, 3)
    _one_line_error(ConfigError, folder, folder / "config.json", "config_path is 3, not a path")
    _set_config_path(folder, None)
    _one_line_error(ConfigError, folder, folder / "config.json", "no config_path")


def test_then_the_configuration_efml_ships_under_that_name(folder, caplog):
    (folder / "small_arch.json").unlink()
    _set_config_path(folder, "/home/author/configs/cnn_50_100_512_4096_sample.json")
    # EFML's shipped architecture is the released one (word_dim 100 …): these small weights do not fit it
    with caplog.at_level(logging.WARNING, logger="elmokit.weights.efml"):
        _one_line_error(WeightsError, folder, "EFML's shipped cnn_50_100_512_4096_sample.json", "word_dim is 100", "16")
    assert "using EFML's shipped cnn_50_100_512_4096_sample.json" in caplog.text
    assert SHIPPED_ARCHITECTURES["cnn_0_100_512_4096_sample.json"]["encoder"]["dim"] == 4096
    _set_config_path(folder, "/home/author/configs/mine.json")
    _one_line_error(MissingFileError, folder, "/home/author/configs/mine.json", folder / "mine.json")


def test_an_architecture_that_disagrees_with_the_tensors_is_named(folder):
    arch = json.loads((folder / "small_arch.json").read_text())
    arch["encoder"]["dim"] = 64
    (folder / "small_arch.json").write_text(json.dumps(arch))
    _one_line_error(WeightsError, folder, "encoder.dim is 64", "encoder.pkl", "gives 32")
    arch["encoder"]["dim"], arch["token_embedder"]["name"] = 32, "lstm"
    (folder / "small_arch.json").write_text(json.dumps(arch))
    _one_line_error(ConfigError, folder, "'lstm'", "cnn + elmo")


def test_perplexity_and_score_say_there_is_no_lm_head(folder, tmp_path, capsys):
    (tmp_path / "s.txt").write_text("a b\n")
    for command in ("perplexity", "score"):
        assert cli_main([command, str(folder), str(tmp_path / "s.txt")]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "carry no softmax (no LM head)" in err and "ELMoForManyLangs" in err


def test_info_describes_the_efml_folder(folder, capsys):
    assert cli_main(["info", str(folder)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "ELMoForManyLangs"
    assert info["architecture"].startswith(str(folder / "small_arch.json"))
    assert (info["word_vocab_size"], info["char_vocab_size"], info["word_embedding_dim"]) == (1104, 701, 16)
    assert info["softmax"].startswith("none") and info["layers"] == 3 and info["output_dim"] == 32


def test_word_ids_are_checked_and_a_model_without_its_vocabulary_says_so(folder):
    model = load_efml(folder)
    ids = batch_to_ids([["a", "b"]], char_vocab=model.char_vocab)
    bad = ids.clone()
    bad[0, 0, -1] = 1104
    with pytest.raises(InputError, match=r"word id 1104 in their last column, outside the word table \[0, 1104\)"):
        model(bad)
    bare = BiLM(model.config)
    with pytest.raises(UsageError, match="no vocabulary attached"):
        bare(ids)


def test_the_word_embedding_round_trips_through_options_json():
    config = load_efml(FIXTURE).config
    options = config.to_options()
    assert options["char_cnn"]["word_embedding"] == {"dim": 16, "n_words": 1104}
    again = ElmoConfig.from_options(json.loads(json.dumps(options)))
    assert again.char_cnn == config.char_cnn and again.extra == config.extra
    options["char_cnn"]["word_embedding"] = {"dim": 16}
    with pytest.raises(ConfigError, match="needs both dim and n_words"):
        ElmoConfig.from_options(options)
    del options["char_cnn"]["char_vocab_size"]
    options["char_cnn"]["n_characters"] = 262
    options["char_cnn"]["word_embedding"] = {"dim": 16, "n_words": 5}
    with pytest.raises(ConfigError, match="without char_cnn.char_vocab_size"):
        ElmoConfig.from_options(options)


def test_a_zip_of_an_efml_folder_loads_as_the_folder(tmp_path):
    archive = shutil.make_archive(str(tmp_path / "efml"), "zip", root_dir=FIXTURE.parent, base_dir=FIXTURE.name)
    from_zip, from_folder = load_pretrained_bilm(archive), load_efml(FIXTURE)
    assert from_zip.char_vocab.words == from_folder.char_vocab.words
    for (name, a), b in zip(from_zip.state_dict().items(), from_folder.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_zip_of_an_efml_folder_is_named_as_the_zip_by_info_logs_and_convert(tmp_path, capsys, caplog):
    archive = shutil.make_archive(str(tmp_path / "efml"), "zip", root_dir=FIXTURE.parent, base_dir=FIXTURE.name)
    shown = f"{archive}:{FIXTURE.name}/small_arch.json"
    with caplog.at_level(logging.WARNING, logger="elmokit.weights.efml"):
        assert cli_main(["info", archive]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "ELMoForManyLangs"  # not "converted": the zip holds the EFML folder itself
    assert info["architecture"].startswith(shown)
    assert f"using {shown}" in caplog.text and "elmokit-zip-" not in caplog.text  # the temporary folder is gone
    assert cli_main(["convert", archive, str(tmp_path / "native")]) == 0
    config = (tmp_path / "native" / "config.json").read_text()
    assert shown in config and "elmokit-zip-" not in config
    capsys.readouterr()
    assert cli_main(["info", str(tmp_path / "native")]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "elmokit (converted from ELMoForManyLangs)"
