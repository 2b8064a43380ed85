"""The key/value cache passed by the name the installed transformers takes (mixprec._kv_cache)."""

from __future__ import annotations

from mixprec._kv_cache import cache_keyword, current_names


def _new_style(input_ids=None, cache=None, use_cache=None, **kwargs):
    return cache


def _old_style(input_ids=None, past_key_values=None, use_cache=None, **kwargs):
    return past_key_values


def test_a_hook_passes_an_apps_old_cache_keyword_by_the_current_name_where_the_method_takes_it():
    cache = object()
    assert current_names(_new_style, {"past_key_values": cache, "use_cache": True}) == {"cache": cache, "use_cache": True}
    assert _new_style(**current_names(_new_style, {"past_key_values": cache})) is cache


def test_everything_else_is_passed_as_given():
    cache, other = object(), object()
    given = {"past_key_values": cache}
    assert current_names(_old_style, given) is given  # the method still takes the old name
    both = {"past_key_values": cache, "cache": other}
    assert current_names(_new_style, both) is both  # both given: the library's own error, not ours
    plain = {"use_cache": True}
    assert current_names(_new_style, plain) is plain


def test_the_keyword_a_model_takes_is_read_from_its_forward():
    class New:
        def forward(self, input_ids=None, cache=None):
            return cache

    class Old:
        def forward(self, input_ids=None, past_key_values=None):
            return past_key_values

    assert (cache_keyword(New()), cache_keyword(Old())) == ("cache", "past_key_values")
