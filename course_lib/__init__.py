"""course_lib: the tested reference implementation behind the PagedAttention course.

Each module holds one concept (KV arithmetic, allocators, the paged pool, prefix caching,
scheduling, attention kernels, the serving engine); ``viz`` draws them and ``grading``
checks learners' exercises. Run ``python -m course_lib --help`` for the command line.
"""

__version__ = "0.1.0"
