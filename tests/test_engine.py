"""The serving engine: paged outputs equal contiguous generation; weights equal transformers'.

The Triton kernel runs under the interpreter here (slow: ~30 ms per program), so the tests
that exercise it use a toy model with one KV head and few tokens; the rest decode with the
torch reference (``decode_attention="torch"``), which reads the same paged pool.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.attention import KERNEL_MODE
from course_lib.engine import (
    GenerationRequest,
    ModelConfig,
    PagedBatch,
    PagedDecode,
    PagedEngine,
    SamplingParams,
    config_from_hf,
    from_hf,
    generate,
    load_pretrained,
    packed_causal_attention,
    random_model,
    sample_token,
    tiny_config,
)
from course_lib.engine.bench import main as bench_main
from course_lib.paged import BlockPool, PagedKVManager
from course_lib.scheduler import SchedulerConfig

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 12, 13]]
GREEDY = SamplingParams(max_tokens=4)
DEVICE = "cuda" if KERNEL_MODE == "cuda" else "cpu"  # where the kernel reads the pool
# Logits of the kernel's decode step against contiguous attention, by the model's dtype.
LOGIT_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
BF16_ON_GPU = pytest.mark.skipif(KERNEL_MODE != "cuda",
                                 reason="bfloat16 needs a CUDA GPU (the interpreter is wrong)")


@pytest.fixture(scope="module")
def model():
    """The toy Llama with one KV head (four query heads share it): cheap for the kernel."""
    return random_model(tiny_config(num_kv_heads=1), seed=0, device=DEVICE)


@pytest.fixture(scope="module")
def plain(model):
    """Ordinary contiguous generation of PROMPTS under GREEDY: what every engine must match."""
    return generate(model, PROMPTS, GREEDY)


def token_ids(outputs):
    return [o.token_ids for o in outputs]


# --- paged == contiguous -------------------------------------------------------------------


def test_greedy_matches_contiguous_generation_through_the_kernel(model, plain) -> None:
    engine = PagedEngine(model, num_blocks=32, block_size=4)
    got = engine.generate(PROMPTS, GREEDY)
    assert token_ids(got) == token_ids(plain)
    assert [len(o.token_ids[0]) for o in got] == [4] * 4
    assert {r for o in got for r in o.finish_reasons} == {"length"}
    stats = engine.stats()
    assert (stats.preemptions, stats.generated_tokens, stats.peak_batch) == (0, 16, 4)
    assert engine.pool.num_free == 31  # everything freed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16,
                                   pytest.param(torch.bfloat16, marks=BF16_ON_GPU)], ids=str)
def test_kernel_decode_step_gives_the_contiguous_logits(dtype: torch.dtype) -> None:
    # Logits, not tokens: in half precision the toy model's near-tied logits would make
    # greedy tokens flip on rounding noise.
    model = random_model(tiny_config(num_kv_heads=1), seed=0, dtype=dtype, device=DEVICE)
    prompts = [p for p in PROMPTS if len(p) > 1]
    lengths = [len(p) for p in prompts]
    expected = model.next_token_logits(
        [t for p in prompts for t in p], [i for n in lengths for i in range(n)],
        lambda layer, q, k, v: packed_causal_attention(q, k, v, lengths), last_of=lengths)
    pool = BlockPool(16, 4, num_kv_heads=1, head_dim=model.config.head_dim,
                     num_layers=model.config.num_layers, dtype=dtype, device=DEVICE)
    manager, ids = PagedKVManager(pool), [f"s{i}" for i in range(len(prompts))]
    for seq_id, n in zip(ids, lengths, strict=True):  # prefill all but the last token
        manager.add_sequence(seq_id, n - 1)
    slots = [s for i, n in zip(ids, lengths, strict=True)
             for s in manager.slot_mapping(i, range(n - 1))]
    table, _ = manager.batch_tables(ids, device=DEVICE)
    model.next_token_logits([t for p in prompts for t in p[:-1]],
                            [i for n in lengths for i in range(n - 1)],
                            PagedBatch(pool, slots, table, [0] * len(ids),
                                       [n - 1 for n in lengths], "torch"))
    for seq_id in ids:
        manager.append_tokens(seq_id)
    slots = [manager.slot_mapping(i, [n - 1])[0] for i, n in zip(ids, lengths, strict=True)]
    table, seq_lens = manager.batch_tables(ids, device=DEVICE)
    got = model.next_token_logits([p[-1] for p in prompts], [n - 1 for n in lengths],
                                  PagedDecode(pool, slots, table, seq_lens, "triton"))
    tolerance = LOGIT_TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)


def test_preemption_under_a_tiny_budget_loses_nothing(model, plain) -> None:
    engine = PagedEngine(model, num_blocks=8, block_size=4)  # 7 blocks = 28 slots for 39
    got = engine.generate(PROMPTS, GREEDY)
    assert token_ids(got) == token_ids(plain)
    stats = engine.stats()
    assert stats.preemptions >= 1 and stats.recomputed_tokens > 0
    assert sum(o.preemptions for o in got) == stats.preemptions
    assert engine.pool.num_free == 7


def test_parallel_samples_share_the_prompt_blocks_then_copy_on_write(model) -> None:
    params = SamplingParams(max_tokens=4, n=3)
    prompt = list(range(10))  # blocks of 4: two full blocks and one holding 2 tokens
    engine = PagedEngine(model, num_blocks=16, block_size=4)
    engine.submit([prompt], params)
    engine.step()  # prefill once, fork to three samples
    manager, pool = engine.manager, engine.pool
    tables = {manager.block_table(f"r0.{k}") for k in range(3)}
    assert len(tables) == 1
    assert [pool.ref_count(b) for b in tables.pop()] == [3, 3, 3]
    engine.step()  # each writes into the shared partial block: two copies, one in place
    tables = [manager.block_table(f"r0.{k}") for k in range(3)]
    assert len({t[:2] for t in tables}) == 1 and len({t[2] for t in tables}) == 3
    while not engine.done:
        engine.step()
    (out,) = engine.outputs()
    (expected,) = generate(model, [prompt], params)
    assert out.token_ids == expected.token_ids
    assert len(set(out.token_ids)) == 1  # greedy samples agree


def test_sampled_parallel_requests_match_under_preemption(model) -> None:
    params = SamplingParams(max_tokens=6, n=2, temperature=0.8, top_p=0.9, seed=7)
    expected = generate(model, PROMPTS, params)
    engine = PagedEngine(model, num_blocks=12, block_size=4, decode_attention="torch")
    got = engine.generate(PROMPTS, params)
    assert token_ids(got) == token_ids(expected)
    assert engine.stats().preemptions >= 1
    assert any(len(set(o.token_ids)) == 2 for o in got)  # the two samples differ
    reseeded = generate(model, PROMPTS, replace(params, seed=8))
    assert token_ids(reseeded) != token_ids(expected)


def test_priority_policy_arrivals_and_limits(model, plain) -> None:
    config = SchedulerConfig(policy="priority", max_num_seqs=3, max_num_batched_tokens=20)
    engine = PagedEngine(model, num_blocks=9, block_size=4, scheduler=config,
                         decode_attention="torch")
    reports = []
    for i, prompt in enumerate(PROMPTS):  # one arrives every third step, more important
        engine.add_request(GenerationRequest(prompt, GREEDY, priority=-i))
        reports += [engine.step() for _ in range(3) if engine.has_unfinished]
    while engine.has_unfinished:
        reports.append(engine.step())
    assert token_ids(engine.outputs()) == token_ids(plain)
    assert [r.admitted for r in reports][:2] == [(0,), ()]
    assert max(r.decoded + len(r.admitted) for r in reports) <= 3
    assert max(r.num_tokens for r in reports) <= 20


def test_end_of_sequence_stops_a_sample(model) -> None:
    (free,) = generate(model, [PROMPTS[0]], GREEDY)
    stop = free.token_ids[0][2]
    eos_model = random_model(replace(model.config, eos_token_ids=(stop,)), seed=0)
    engine = PagedEngine(eos_model, num_blocks=16, block_size=4, decode_attention="torch")
    (out,) = engine.generate([PROMPTS[0]], GREEDY)
    assert out.token_ids[0] == free.token_ids[0][: free.token_ids[0].index(stop) + 1]
    assert out.finish_reasons == ("stop",)
    (ignored,) = engine.generate([PROMPTS[0]], replace(GREEDY, ignore_eos=True))
    assert ignored.token_ids == free.token_ids


class CharTokenizer:
    """Bytes as tokens: the two methods the engine uses from a Hugging Face tokenizer."""

    def encode(self, text: str) -> list[int]:
        return [b % 128 for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return bytes(ids).decode("latin-1")


def test_text_in_text_out(model) -> None:
    tokenizer = CharTokenizer()
    engine = PagedEngine(model, num_blocks=16, block_size=4, tokenizer=tokenizer,
                         decode_attention="torch")
    (out,) = engine.generate(["paged"], GREEDY)
    assert out.prompt_token_ids == tuple(tokenizer.encode("paged"))
    assert out.texts == (tokenizer.decode(list(out.token_ids[0])),)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    max_tokens=st.integers(1, 6),
    n=st.integers(1, 2),
    block_size=st.sampled_from([1, 2, 4]),
    spare=st.integers(0, 6),
)
def test_any_budget_gives_contiguous_outputs_and_drains(
    model, lengths: list[int], max_tokens: int, n: int, block_size: int, spare: int
) -> None:
    prompts = [[(7 * i + j) % 128 for j in range(length)] for i, length in enumerate(lengths)]
    params = SamplingParams(max_tokens=max_tokens, n=n, temperature=1.0, seed=1)
    longest = max(lengths) + max_tokens
    blocks = n * -(-longest // block_size) + spare + 1  # the least that can serve them
    engine = PagedEngine(model, num_blocks=blocks, block_size=block_size,
                         decode_attention="torch")
    assert token_ids(engine.generate(prompts, params)) == token_ids(
        generate(model, prompts, params, max_batch=2))
    assert engine.pool.num_free == blocks - 1 and not engine.manager.sequences


# --- the model against transformers -------------------------------------------------------

ROPE_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
               "rope_theta": 500000.0}


@pytest.mark.parametrize(("rope", "tie"), [(None, False), (ROPE_LLAMA3, True)])
def test_logits_match_transformers(rope: dict | None, tie: bool) -> None:
    transformers = pytest.importorskip("transformers")
    kwargs = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=128, tie_word_embeddings=tie, initializer_range=0.2)
    if rope is not None:
        kwargs["rope_parameters"] = rope
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs)).eval()
    ours = from_hf(hf)
    assert ours.config.rope_scaling is not None or rope is None
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    got = ours.next_token_logits(ids.tolist(), list(range(40)),
                                 lambda layer, q, k, v: packed_causal_attention(q, k, v, [40]))
    assert expected.std() > 0.1  # not a degenerate comparison
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_load_a_local_checkpoint(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=64,
                                      eos_token_id=[3, 5])
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    model, tokenizer = load_pretrained(str(tmp_path), dtype=torch.float16)
    assert tokenizer is None  # the folder holds weights only
    assert (model.dtype, model.config.eos_token_ids, model.config.num_kv_heads) == (
        torch.float16, (3, 5), 1)


def test_unsupported_checkpoints_are_refused() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2)
    config.model_type = "mistral"
    with pytest.raises(ValueError, match="model_type 'mistral'"):
        config_from_hf(config)


# --- bad inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(n=0), "n must"),
    (dict(seed=-1), "seed"),
])
def test_bad_sampling_params(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_configs() -> None:
    with pytest.raises(ValueError, match="num_heads=3"):
        tiny_config(num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig(vocab_size=8, hidden_size=0, intermediate_size=8, num_layers=1,
                    num_heads=1, num_kv_heads=1, head_dim=8)
    with pytest.raises(ValueError, match="one row"):
        sample_token(torch.zeros(2, 4), SamplingParams(), None)


@pytest.mark.parametrize(("requests", "message"), [
    ([], "requests is empty"),
    ("hello", "list of prompts"),
    ([[]], "prompt is empty"),
    ([[1, 128]], "token id 128 is outside the vocabulary"),
    ([[1, -1]], "token id -1"),
    (["text"], "needs a tokenizer"),
    ([list(range(100))], "needs up to 26 blocks"),
    ([[1] * 510], "max_position_embeddings=512"),
])
def test_bad_requests(model, requests: list, message: str) -> None:
    engine = PagedEngine(model, num_blocks=16, block_size=4)
    with pytest.raises(ValueError, match=message):
        engine.submit(requests, GREEDY)


def test_bad_engine_use(model) -> None:
    with pytest.raises(ValueError, match="preemption 'swap'"):
        PagedEngine(model, num_blocks=8, scheduler=SchedulerConfig(preemption="swap"))
    with pytest.raises(ValueError, match="decode_attention 'cuda'"):
        PagedEngine(model, num_blocks=8, decode_attention="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_blocks"):
        PagedEngine(model, num_blocks=1)
    engine = PagedEngine(model, num_blocks=16, block_size=4, decode_attention="torch",
                         scheduler=SchedulerConfig(max_num_batched_tokens=8))
    with pytest.raises(ValueError, match="nothing to run"):
        engine.step()
    unchunked = PagedEngine(model, num_blocks=16, block_size=4, decode_attention="torch",
                            scheduler=SchedulerConfig(max_num_batched_tokens=8),
                            chunked_prefill=False)
    unchunked.submit([[1, 2, 3, 4, 5]], GREEDY)  # 5 + 4 tokens: the last never gets K/V
    with pytest.raises(ValueError, match="prefill up to 9 tokens"):
        unchunked.submit([[1, 2], [1, 2, 3, 4, 5, 6]], GREEDY)
    assert unchunked.unfinished == (0,)  # the whole batch was refused
    engine.submit([[1, 2, 3, 4, 5, 6]], GREEDY)  # chunked: fine
    with pytest.raises(ValueError, match="have not finished"):
        engine.outputs()
    with pytest.raises(ValueError, match="either to every GenerationRequest or once"):
        generate(model, [GenerationRequest([1])], GREEDY)
    with pytest.raises(ValueError, match="max_len=3 is shorter"):
        generate(model, [[1, 2]], GREEDY, max_len=3)


# --- the benchmark -------------------------------------------------------------------------


def test_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    threads = torch.get_num_threads()
    try:
        assert bench_main(["--smoke", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[2].split()[-1] == "paged/contiguous"  # last, as tools/gpu_check.sh reads it
    assert "own ms/pass" in lines[2] and "contig@avg" in lines[2]
    budget_rows = [line.split() for line in lines if line.startswith("budget")]
    assert budget_rows and all(len(row) == 13 for row in budget_rows)  # contig@avg filled in
    off, on = (line.split() for line in lines if line.startswith(("off ", "on ")))
    assert off[2] == "0" and int(on[2]) > 0
    assert int(on[1]) + int(on[2]) == int(off[1])  # every cached token is one not computed
    pools = [line.split() for line in lines[-2:]]
    assert [row[0] for row in pools] == ["64", "4,096"] and pools[0][-1] == "1.00x"


def test_bench_refuses_a_bad_request_count(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_main(["--smoke", "--requests", "0"])
    assert "--requests: must be an integer from 1" in capsys.readouterr().err
