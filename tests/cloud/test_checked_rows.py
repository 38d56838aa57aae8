"""The rows exact checks kept (``coinfer.cloud.checked_rows``): keyed by every token before them, bounded (the
real engine reading them where vLLM's prefix cache served a check: tests/integration/test_open.py)."""

from coinfer.cloud.checked_rows import CheckedRows, context_keys


def test_a_rows_key_is_its_whole_context_so_the_same_token_after_other_tokens_is_another_row():
    a, b = context_keys([5, 7, 9]), context_keys([6, 7, 9])
    assert len(a) == 4 and a[0] == b[0] == b"" and len(set(a)) == 4
    assert not set(a[1:]) & set(b[1:])  # differ from the first token on, however the rest agrees
    assert context_keys([5, 7]) == a[:3]  # a context's key does not depend on what follows it


def test_the_rows_kept_are_the_last_ones_used_up_to_the_bound():
    rows, keys = CheckedRows(size=3), context_keys(range(5))
    for i, k in enumerate(keys[:3]):
        rows.put(k, (i, 1.0))
    assert rows.get(keys[0]) == (0, 1.0)  # used: kept over keys[1]
    rows.put(keys[3], (3, 1.0))
    assert len(rows) == 3 and rows.get(keys[1]) is None and rows.get(keys[0]) == (0, 1.0)


def test_cleared_rows_are_gone_as_a_reset_prefix_cache_leaves_none_of_its_checks():
    rows, keys = CheckedRows(), context_keys([1, 2])
    rows.put(keys[1], (2, 0.5))
    rows.clear()
    assert len(rows) == 0 and rows.get(keys[1]) is None
