"""`attnlab import-hf` and `export-hf` of Whisper: a tiny random WhisperForConditionalGeneration (d 16, 2
encoder and 1 decoder layers, 8 mel bands, a 1 s window at 16 kHz read as 50 frames, every tensor but
the encoder's sinusoids perturbed, the final LayerNorm's bias pushed towards <eos> so that some
transcripts end and some run to the limit) and its feature extractor and word tokenizer become a whisper run whose encoder
states and logits equal transformers' (float32, max abs difference <= 1e-5) on the same waveforms, whose
log-mels equal WhisperFeatureExtractor's (<= 1e-4), and whose greedy and beam search give transformers'
generate; a run attnlab trains with Whisper's settings exports and transformers reads it the same;
what either side cannot represent is refused in one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from attnlab.data.tokenizers import BOS, EOS, PAD, Tokenizer
from attnlab.decode.search import beam_search, greedy
from attnlab.runs.checkpoint import load_run

from helpers import run_cli

RATE, SECONDS, HOP = 16_000, 1, 320  # 50 frames, 25 encoder positions
WORDS = "zero one two three four five six seven eight nine".split()


def tokenizer() -> Tokenizer:
    """attnlab's word tokenizer of the digits: <pad> <bos> <eos> <unk> 0-3, then the words."""
    return Tokenizer.train("word", WORDS)


def tiny_folder(path: Path, seed: int = 0, config: dict | None = None, extractor: dict | None = None) -> Path:
    """A random WhisperForConditionalGeneration saved as transformers saves it, with its
    WhisperFeatureExtractor and a tokenizer.json numbering attnlab's controls as attnlab does (the
    perturbation and the push towards <eos> chosen, seed 0, so that the three transcripts of
    :func:`waveforms` are not all one, some end and some run to the limit)."""
    vocab = tokenizer().vocab_size
    hf_config = transformers.WhisperConfig(
        **{
            "vocab_size": vocab,
            "num_mel_bins": 8,
            "d_model": 16,
            "encoder_layers": 2,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 32,
            "decoder_ffn_dim": 32,
            "max_source_positions": RATE * SECONDS // HOP // 2,
            "max_target_positions": 16,
            "pad_token_id": PAD,
            "bos_token_id": BOS,
            "eos_token_id": EOS,
            "decoder_start_token_id": BOS,
            "suppress_tokens": [],
            "begin_suppress_tokens": [],
        }
        | (config or {})
    )
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(hf_config).eval()
    with torch.no_grad():  # the initial LayerNorms and biases are 1 and 0: make every tensor count
        for name, p in model.named_parameters():
            if "embed_positions" not in name or "decoder" in name:  # the encoder's sinusoids stay
                p.add_(torch.randn_like(p) * 0.5)
        eos = model.model.decoder.embed_tokens.weight[EOS]
        model.model.decoder.layer_norm.bias.add_(0.3 * eos / eos.norm())
    model.save_pretrained(path, safe_serialization=True)
    transformers.WhisperFeatureExtractor(
        **{"feature_size": 8, "sampling_rate": RATE, "hop_length": HOP, "chunk_length": SECONDS, "n_fft": 400}
        | (extractor or {})
    ).save_pretrained(path)
    (path / "tokenizer.json").write_text(tokenizer().to_str())
    return path


def waveforms() -> torch.Tensor:
    """(3, RATE SECONDS) sounds that fill the window, their last sample sounding (no padding to compare):
    a low tone for the first half, noise, a high tone from 0.3 s on over a little noise."""
    g = torch.Generator().manual_seed(1)
    t = torch.arange(RATE * SECONDS) / RATE
    return torch.stack(
        [
            0.5 * torch.sin(2 * torch.pi * 300 * t) * (t < 0.5) + 0.01 * torch.randn(t.numel(), generator=g),
            0.05 * torch.randn(t.numel(), generator=g),
            0.5 * torch.sin(2 * torch.pi * 2500 * t) * (t > 0.3) + 0.01 * torch.randn(t.numel(), generator=g),
        ]
    )


def features(folder: Path, sound: torch.Tensor) -> torch.Tensor:
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    return extractor(list(sound.numpy()), sampling_rate=RATE, return_tensors="pt").input_features


def reference(folder: Path) -> transformers.WhisperForConditionalGeneration:
    return transformers.WhisperForConditionalGeneration.from_pretrained(folder, attn_implementation="eager").eval()


def imported(tmp_path: Path, folder: Path, name: str = "run"):
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / name))
    assert done.returncode == 0, done.stderr
    model, toks, cfg = load_run(tmp_path / name)
    return model.eval(), toks, cfg


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("whisper") / "hf")


def test_the_imported_run_has_whispers_settings_and_transformers_log_mels(tmp_path, folder):
    model, toks, cfg = imported(tmp_path, folder)
    assert (cfg.reading.reads, cfg.embeddings.kind, cfg.stack.norm, cfg.encoder_layers, cfg.decoder_layers) == (
        "window",
        "plain",
        "pre",
        2,
        1,
    )
    assert toks["tgt"].encode("three one") == tokenizer().encode("three one")
    sound = waveforms()
    ours = model.spectrogram.features(sound)  # (B, frames, n_mels)
    theirs = features(folder, sound).transpose(1, 2)  # (B, n_mels, frames) -> (B, frames, n_mels)
    assert ours.shape == theirs.shape == (3, 50, 8)
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_encoder_states_and_logits_equal_transformers(tmp_path, folder):
    model, _, _ = imported(tmp_path, folder)
    hf = reference(folder)
    sound = waveforms()
    tgt_in = torch.tensor([[BOS, 5, 9, 4, 6], [BOS, 7, 7, 8, 4], [BOS, 13, 4, 5, 12]])
    with torch.no_grad():
        memory, valid = model.encode(sound)
        out = hf(input_features=features(folder, sound), decoder_input_ids=tgt_in)
        logits = model(sound, tgt_in)
    assert valid.all() and memory.shape == out.encoder_last_hidden_state.shape == (3, 25, 16)
    assert (memory - out.encoder_last_hidden_state).abs().max().item() <= 1e-5
    assert (logits - out.logits).abs().max().item() <= 1e-5


def test_a_short_clip_is_read_in_whispers_window_as_transformers_pads_it(tmp_path, folder):
    """A 0.4 s clip: the extractor pads it with silence to the 1 s chunk, and the encoder reads all of it."""
    model, _, _ = imported(tmp_path, folder)
    hf = reference(folder)
    clip = waveforms()[:1, : 2 * RATE // 5]
    tgt_in = torch.tensor([[BOS, 6, 5]])
    with torch.no_grad():
        expected = hf(input_features=features(folder, clip), decoder_input_ids=tgt_in).logits
        assert (model(clip, tgt_in) - expected).abs().max().item() <= 1e-5


def generate(hf, inputs: torch.Tensor, beam: int, limit: int, min_len: int) -> list[list[int]]:
    """transformers' search from the decoder's start (<bos>), <pad> and <bos> never predicted (as
    attnlab's), each transcript to its <eos>, or its first ``limit`` tokens (attnlab's max_len) where
    none came in ``limit + 1``."""
    settings = {"length_penalty": 0.0, "early_stopping": False} if beam > 1 else {}
    with torch.no_grad():
        out = transformers.GenerationMixin.generate(
            hf,
            input_features=inputs,
            num_beams=beam,
            do_sample=False,
            max_new_tokens=limit + 1,
            min_new_tokens=min_len,
            suppress_tokens=[PAD, BOS],
            **settings,
        )
    return [row[: row.index(EOS)] if EOS in row else row[:limit] for row in out[:, 1:].tolist()]


@pytest.mark.parametrize("beam", [1, 3])
def test_greedy_and_beam_search_equal_transformers_generate(tmp_path, folder, beam):
    model, _, _ = imported(tmp_path, folder)
    hf = reference(folder)
    sound = waveforms()
    limit, min_len = 12, 3
    expected = generate(hf, features(folder, sound), beam, limit, min_len)
    with torch.no_grad():
        ours = (
            greedy(model, sound, max_len=limit, min_len=min_len)
            if beam == 1
            else [
                hyps[0].tokens
                for hyps in beam_search(model, sound, beam=beam, lenpen=0.0, max_len=limit, min_len=min_len)
            ]
        )
    assert ours == expected and len({tuple(row) for row in expected}) >= 2  # the sound is heard
    assert {len(row) for row in expected} == {min_len, limit}  # at the earliest end, and at the limit


@pytest.mark.parametrize(
    "config, extractor, message",
    [
        ({"encoder_ffn_dim": 48}, {}, "encoder_ffn_dim 48 unlike decoder_ffn_dim 32 (attnlab has one d_ff)"),
        ({"max_source_positions": 30}, {}, "max_source_positions 30 (the encoder reads half the 50 frames"),
        ({"activation_function": "tanh"}, {}, "activation_function 'tanh' (have gelu, gelu_new, relu, silu)"),
        ({}, {"sampling_rate": 8000, "hop_length": 160}, "sampling_rate 8000 (the extractor's mel bands stop at 8 kHz"),
        ({"eos_token_id": 5}, {}, "attnlab imports Whisper folders that number <pad> <bos> <eos> <unk> 0-3"),
    ],
    ids=["ffn", "window", "activation", "rate", "vocabulary"],
)
def test_a_folder_attnlab_cannot_represent_is_refused_in_one_line(tmp_path, config, extractor, message):
    hf = tiny_folder(tmp_path / "hf", config=config, extractor=extractor)
    done = run_cli("import-hf", str(hf), "--out", str(tmp_path / "run"))
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert message in done.stderr and not (tmp_path / "run").exists()


def test_trained_encoder_positions_are_refused(tmp_path):
    hf = tiny_folder(tmp_path / "hf")
    from safetensors.torch import load_file, save_file

    weights = load_file(str(hf / "model.safetensors"))
    weights["model.encoder.embed_positions.weight"] += 0.01
    save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})
    done = run_cli("import-hf", str(hf), "--out", str(tmp_path / "run"))
    assert done.returncode != 0 and "model.encoder.embed_positions.weight is not Whisper's sinusoids" in done.stderr


# -- a run attnlab trains, out to transformers -------------------------------------------------------


def trained(tmp_path: Path, **model: object) -> Path:
    """A whisper run trained 3 steps on strings of pips (test_speech_recognition.py's recordings of three
    digits at 8 kHz, read at 16 kHz), with Whisper's settings (``model``: others)."""
    from test_speech_recognition import write_pips

    data = write_pips(tmp_path / "recordings")
    fields = {
        "arch": "whisper",
        "reads": "window",
        "embeddings": {"kind": "plain"},
        "features": {"n_mels": 8, "hop_ms": 20.0},
        "stack": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0},
    } | model
    config = {
        "model": fields,
        "data": {
            "task": "speech_recognition",
            "recordings": str(data),
            "sample_rate": RATE,
            "strings": {"min_digits": 1, "max_digits": 2, "max_gap_ms": 50, "longest_seconds": 1.0},
            "splits": {"seed": 0, "n_train": 8, "n_valid": 4},
        },
        "train": {"max_steps": 3, "batch_size": 4, "eval_every": 3, "progress": False},
    }
    (tmp_path / "run.json").write_text(json.dumps(config))
    done = run_cli("train", str(tmp_path / "run.json"), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    return tmp_path / "run"


def test_a_run_trained_by_attnlab_exports_and_transformers_reads_it_the_same(tmp_path):
    run = trained(tmp_path)
    done = run_cli("export-hf", str(run), "--out", str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    model, _, _ = load_run(run)
    hf = reference(tmp_path / "hf")
    sound = waveforms()
    tgt_in = torch.tensor([[BOS, 4, 5], [BOS, 6, 4], [BOS, 5, 6]])  # the three digits' ids
    with torch.no_grad():
        ours = model.eval()(sound, tgt_in)
        inputs = features(tmp_path / "hf", sound)
        assert (model.spectrogram.features(sound).transpose(1, 2) - inputs).abs().max().item() <= 1e-4
        theirs = hf(input_features=inputs, decoder_input_ids=tgt_in).logits
    assert (ours - theirs).abs().max().item() <= 1e-5 * max(1.0, ours.abs().max().item())
    names = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert names.convert_ids_to_tokens([PAD, BOS, EOS]) == ["<pad>", "<bos>", "<eos>"]


@pytest.mark.parametrize(
    "model, message",
    [
        ({"reads": "clip"}, "reads 'clip' (Whisper's is 'window')"),
        ({"embeddings": {"kind": "scaled"}}, "embeddings.kind 'scaled' (Whisper's is 'plain')"),
    ],
    ids=["clip", "scaled"],
)
def test_an_export_of_options_whisper_lacks_names_them_in_one_line(tmp_path, model, message):
    run = trained(tmp_path, **model)
    done = run_cli("export-hf", str(run), "--out", str(tmp_path / "hf"))
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert message in done.stderr and not (tmp_path / "hf").exists()


def test_the_imported_run_transcribes_a_wav_as_transformers_generates(tmp_path, folder):
    """`attnlab transcribe` of the imported run reads the file at the extractor's 16 kHz, pads it to the
    window as the extractor does, and writes what transformers' greedy generate decodes to."""
    import soundfile as sf

    imported(tmp_path, folder)
    sf.write(tmp_path / "a.wav", waveforms()[2].numpy(), RATE, subtype="FLOAT")
    sound, _ = sf.read(tmp_path / "a.wav", dtype="float32")
    done = run_cli("transcribe", str(tmp_path / "run"), str(tmp_path / "a.wav"), "--beam", "1", "--max-len", "12")
    assert done.returncode == 0, done.stderr
    ids = generate(reference(folder), features(folder, torch.tensor(sound)[None]), beam=1, limit=12, min_len=0)[0]
    assert ids and done.stdout == f"{tmp_path / 'a.wav'}\t{tokenizer().decode(ids)}\n"
