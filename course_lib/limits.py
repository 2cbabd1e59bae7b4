"""Sizes the course's tools refuse up front, so no call runs for minutes or exhausts memory.

Each limit is far above anything a chapter uses, and each is checked before any work
starts, so a value typed by mistake (``--budget-gib 1e18``, ``--samples 100000000``) ends
in a one-line error naming it instead of a frozen machine. The figures were measured on a
2-core laptop-class CPU; the comment on each says what it costs at the limit.
"""

from __future__ import annotations

MAX_BUDGET_GIB = 2**20
"""Largest KV budget (and swap space) in GiB: one PiB, past any machine's memory, and small
enough that byte counts stay exact in a float."""

MAX_POOL_BLOCKS = 2**20
"""Most blocks in a simulated or demo pool (1,048,576, 34x the guide's 30,720): building
it takes about 0.3 s and 100 MB; a run over it about 5 s."""

MAX_SHAPE = 2**16
"""Largest layer count, KV-head count, head size and block size: 65,536, hundreds of times
any real model's, so bytes per token stays an exact float."""

MAX_LEN = 2**24
"""Longest request in tokens (16,777,216), above every published context window."""

MAX_TRACE_TOKENS = 2**22
"""Most prompt plus reply tokens in one trace (4,194,304; the support-chat preset has 3.1
million): a run decodes at most one step per reply token, so even the worst case (all
reply, ``--max-num-seqs 1``) ends in about 15 s."""

MAX_ARRIVAL_STEP = 10**6
"""Latest arrival step in a trace: the simulator spends a list entry on every idle step
before an arrival, so a million is about 40 MB."""

MAX_TRACE_REQUESTS = 10**5
"""Most requests in one trace, generated or read (33x the preset's 3,000): a simulation
spends about 30 us on each, so about 3 s at the limit."""

MAX_DEMO_STEPS = 2**20
"""Most tokens a sharing demo or measurement appends or hashes, over all its sequences
(1,048,576; the source's demos use 800 and 50,000): about 4 s at the limit."""

MAX_DEMO_SEQUENCES = 2**14
"""Most sequences (samples, chats, beams) in one sharing demo (16,384; the source uses
50): each costs about 60 us of bookkeeping beyond its tokens."""

MAX_TRACE_FILE_BYTES = 2**26
"""Largest trace file read (64 MiB): room for the largest trace with its token ids."""

MAX_INT = 2**63 - 1
"""Largest seed, priority level count or scheduler limit: what numpy's int64 holds."""

GRADER_MIN_MEMORY_MB = 1024
"""Least ``grade --memory-mb`` accepted: a kernel in the sandbox started 4 of 4 times at 256 MB
and imported torch at 768 MB (glibc held to two malloc arenas); below 512 MB it failed to
start 3 times in 4 before that. 1,024 MB leaves every chapter's imports room."""

GRADER_MEMORY_MB = 12_288
"""Default address-space limit of a graded notebook's kernel (``grade --memory-mb``). Address
space, not resident memory: chapter 06's 64-bit-addressing case maps an 8 GiB K/V cache it
never touches, which costs address space but no memory."""
