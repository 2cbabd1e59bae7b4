"""What sharing saves: the source's demos exactly, and the sampling / beam-search measurements."""

from __future__ import annotations

import json
import math
import re

import pytest

from course_lib.__main__ import main
from course_lib.sharing import (
    BeamRequest,
    SamplingRequest,
    beam_trace,
    cow_demo,
    measure_beam_search,
    measure_parallel_sampling,
    sampling_trace,
    system_prompt_sharing,
)


def test_cow_demo_reproduces_the_source() -> None:
    demo = cow_demo(prompt_tokens=1000, samples=4, new_tokens=200, block_size=16)
    assert (demo.blocks_in_use, demo.blocks_without_sharing) == (114, 300)
    assert demo.first_block_refcount == 4
    assert demo.saving == pytest.approx(0.62)
    assert demo.cow_copies == 3
    # Block 0 is reserved here, so every id is the source's plus one.
    assert demo.last_prompt_block_per_sample == (64, 65, 66, 63)
    assert demo.as_dict()["last_prompt_block_per_sample_from_0"] == [63, 64, 65, 62]


def test_cow_demo_with_a_block_aligned_prompt_copies_nothing() -> None:
    demo = cow_demo(prompt_tokens=64, samples=3, new_tokens=5, block_size=16)
    assert demo.cow_copies == 0 and demo.last_prompt_block_per_sample == (4, 4, 4)
    assert demo.blocks_in_use == 4 + 3


def test_system_prompt_sharing_reproduces_the_source() -> None:
    demo = system_prompt_sharing(prompt_tokens=1000, requests=50, block_size=16)
    assert (demo.blocks_with_sharing, demo.blocks_without_sharing) == (112, 3150)
    assert (demo.shared_blocks, demo.shareable_tokens) == (62, 992)
    assert demo.tokens_not_recomputed == 49 * 992
    assert demo.hit_rate == pytest.approx(49 * 992 / 50_000)


def test_with_blocks_of_128_only_896_tokens_are_shareable() -> None:
    demo = system_prompt_sharing(prompt_tokens=1000, requests=50, block_size=128)
    assert (demo.shareable_tokens, demo.shared_blocks) == (896, 7)
    assert (demo.blocks_with_sharing, demo.blocks_without_sharing) == (7 + 50, 400)


def test_a_block_aligned_system_prompt_recomputes_its_last_block_but_counts_it_once() -> None:
    # 1,024 tokens fill 64 blocks; every later chat must compute its last prompt token, so
    # it takes 63 blocks from the cache and writes block 64 again (cached again, same hash).
    demo = system_prompt_sharing(prompt_tokens=1024, requests=50, block_size=16)
    assert (demo.shared_blocks, demo.blocks_with_sharing) == (63, 63 + 50)
    assert demo.shareable_tokens == 1024
    assert demo.tokens_not_recomputed == 49 * 63 * 16
    assert system_prompt_sharing(prompt_tokens=16, requests=3).shareable_tokens == 16


def test_a_single_sample_or_beam_saves_nothing() -> None:
    assert measure_parallel_sampling([SamplingRequest(37, (20,))]).saving == 0.0
    assert measure_beam_search([BeamRequest(37, 20)], beam_width=1).saving == 0.0


def test_parallel_sampling_block_steps_by_hand() -> None:
    # Prompt of 4 (one full block of 4), two samples of 1 and 2 tokens, blocks of 4.
    # Step 1: prompt block + one new block each = 3 (unshared 2 x 2); step 2: 2 (unshared 2).
    result = measure_parallel_sampling([SamplingRequest(4, (1, 2))], block_size=4)
    assert (result.block_steps_with_sharing, result.block_steps_without_sharing) == (5, 6)


def test_the_measurements_are_seeded() -> None:
    trace = sampling_trace(5, n=3, mean_prompt=40, mean_output=30, seed=7)
    assert trace == sampling_trace(5, n=3, mean_prompt=40, mean_output=30, seed=7)
    assert trace != sampling_trace(5, n=3, mean_prompt=40, mean_output=30, seed=8)
    beams = beam_trace(5, mean_prompt=40, mean_output=30, seed=7)
    assert measure_beam_search(beams, seed=1) == measure_beam_search(beams, seed=1)


def test_what_drives_the_saving() -> None:
    short_prompts = sampling_trace(30, n=4, mean_prompt=20, mean_output=60, seed=0)
    long_prompts = sampling_trace(30, n=4, mean_prompt=200, mean_output=60, seed=0)
    sampling = measure_parallel_sampling(short_prompts).saving
    assert 0 < sampling < measure_parallel_sampling(long_prompts).saving
    beams = beam_trace(30, mean_prompt=20, mean_output=60, seed=0)
    narrow, wide = measure_beam_search(beams, 2).saving, measure_beam_search(beams, 6).saving
    assert sampling < narrow < wide < 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: cow_demo(prompt_tokens=0), "prompt_tokens must be an integer >= 1, got 0"),
        (lambda: cow_demo(samples=0), "samples must be an integer >= 1, got 0"),
        (lambda: cow_demo(new_tokens=-1), "new_tokens must be an integer >= 0, got -1"),
        (lambda: cow_demo(block_size=0), "block_size must be an integer >= 1, got 0"),
        (lambda: system_prompt_sharing(requests=0), "requests must be an integer >= 1, got 0"),
        (lambda: sampling_trace(3, n=0, mean_prompt=5, mean_output=5), "n must be .* got 0"),
        (lambda: beam_trace(3, mean_prompt=-1, mean_output=5), "mean_prompt must be .* got -1"),
        (lambda: measure_beam_search([], beam_width=0), "beam_width must be .* got 0"),
    ],
)
def test_bad_arguments(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_cow_demo_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["cow-demo", "--prompt-tokens", "1000", "--samples", "4", "--new-tokens", "200",
            "--block-size", "16"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["blocks_in_use"], result["blocks_without_sharing"]) == (114, 300)
    assert result["first_block_refcount"] == 4
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "114" in table and "300" in table and "62%" in table and "63, 64, 65, 62" in table


def test_prefix_demo_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["prefix-demo", "--prompt-tokens", "1000", "--requests", "50", "--block-size", "16"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {k: result[k] for k in ("blocks_with_sharing", "blocks_without_sharing",
                                   "shared_blocks", "shareable_tokens")} == {
        "blocks_with_sharing": 112, "blocks_without_sharing": 3150,
        "shared_blocks": 62, "shareable_tokens": 992,
    }
    assert main(argv) == 0
    assert "112 (62 shared + 50 private)" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["cow-demo", "prefix-demo"])
def test_commands_reject_bad_values_with_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--block-size", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "error: argument --block-size: must be an integer from 1 to 65,536, got '0'\n"


@pytest.mark.parametrize(
    ("call", "message"),
    [(lambda: sampling_trace(3, n=2, mean_prompt=math.inf, mean_output=5),
      "mean_prompt must be a positive number, got inf"),
     (lambda: sampling_trace(3, n=2, mean_prompt=5, mean_output=1e300),
      "mean_output must be at most 1,048,576, got 1e+300"),
     (lambda: sampling_trace(10**5, n=16, mean_prompt=5, mean_output=5), "num_requests x n"),
     (lambda: beam_trace(3, mean_prompt=math.nan, mean_output=5), "mean_prompt"),
     (lambda: SamplingRequest(5, ()), "output_lens must be a non-empty tuple"),
     (lambda: measure_parallel_sampling([(5, (1,))]),  # type: ignore[list-item]
      "trace must hold SamplingRequest records, got (5, (1,))"),
     (lambda: measure_parallel_sampling(SamplingRequest(5, (1,))),  # type: ignore[arg-type]
      "trace must be a list of SamplingRequest"),
     (lambda: measure_parallel_sampling([SamplingRequest(5, (10**6,) * 2)]),
      "the tokens the samples append is 2,000,000"),
     (lambda: measure_beam_search([BeamRequest(5, 10**6)], beam_width=4),
      "the tokens the beams append"),
     (lambda: cow_demo(prompt_tokens=10**8), "prompt_tokens must be an integer <= 16,777,216"),
     (lambda: cow_demo(samples=16384, new_tokens=1000), "the blocks cow_demo needs"),
     (lambda: cow_demo(samples=1000, new_tokens=2000, block_size=64),
      "the tokens cow_demo appends, samples x new_tokens, is 2,000,000"),
     (lambda: system_prompt_sharing(prompt_tokens=2000, requests=1000),
      "the prompt tokens system_prompt_sharing hashes"),
     (lambda: system_prompt_sharing(requests=10**18), "requests must be an integer <= 16,384")],
)
def test_work_too_large_or_malformed_is_refused_up_front(call, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
