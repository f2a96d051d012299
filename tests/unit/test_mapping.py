"""node/mapping.py: subject transforms, weighted and cluster-scoped mappings.

The expected values come from nats-server 2.15 (the ADR-30 examples and
what `tests/integration/test_mapping_diff.py` observed on a running server).
"""

from __future__ import annotations

import random

import pytest

from node.mapping import (
    MappingError,
    MappingTable,
    build_mapping,
    compile_transform,
    fnv1a32,
    reverse_transform,
    tokenize_wildcards,
    validate_mapping_destination,
)


@pytest.mark.parametrize(("src", "dest", "subject", "expected"), [
    (">", "uno.>", "one.two.three", "uno.one.two.three"),
    (">", ">", "one.two.three", "one.two.three"),
    (">", "eins.zwei.drei.vier.>", "four.five.six", "eins.zwei.drei.vier.four.five.six"),
    ("one.>", "uno.>", "one.two.three", "uno.two.three"),
    ("one.two.>", "uno.dos.>", "one.two.three", "uno.dos.three"),
    ("one", "uno", "one", "uno"),
    ("one.*.three.*.five", "uno.$2.$1", "one.two.three.four.five", "uno.four.two"),
    ("one.*.three.*.five", "uno.{{wildcard(2)}}.{{wildcard(1)}}", "one.two.three.four.five",
     "uno.four.two"),
    ("*.two.three.>", "uno.$1.>", "one.two.three.four.five", "uno.one.four.five"),
    ("*", "{{split(1,-)}}", "-abc-def--ghij-", "abc.def.ghij"),
    ("*", "{{split(1,--)}}", "foo--bar", "foo.bar"),
    ("*", "{{splitfromleft(1,3)}}", "12345", "123.45"),
    ("*", "{{SplitFromRight(1,3)}}", "12345", "12.345"),
    ("*", "{{SliceFromLeft(1,3)}}", "1234567890", "123.456.789.0"),
    ("*", "{{SliceFromRight(1,3)}}", "1234567890", "1.234.567.890"),
    ("*", "{{slicefromleft(1,2)}}", "1234567", "12.34.56.7"),
    ("*", "{{slicefromright(1,2)}}", "1234567", "1.23.45.67"),
    ("*", "{{splitfromleft(1,9)}}", "12345", "12345"),  # too short: kept whole
    ("*", "{{left(1,2)}}.{{right(1,2)}}", "abcdef", "ab.ef"),
    ("*", "{{left(1,2)}}", "a", "a"),
    ("neworders.*", "neworders.{{wildcard(1)}}.{{partition(3,1)}}", "neworders.customerid1",
     "neworders.customerid1.0"),
    ("neworders.*", "neworders.{{wildcard(1)}}.{{partition(3,1)}}", "neworders.customerid2",
     "neworders.customerid2.2"),
    ("foo.*.*", "foo.{{partition(10,1,2)}}", "foo.2.b", "foo.9"),
    ("s", "s.{{partition(5)}}", "s", "s.2"),  # no tokens named: the whole subject is hashed
    ("z.*", "z.{{wildcard(0)}}", "z.aa", "z.z"),  # index 0 reads the first token, as nats-server
    ("a.*", "b.{{ wildcard ( 1 ) }}", "a.q", "b.q"),
])
def test_transform_results(src: str, dest: str, subject: str, expected: str) -> None:
    assert compile_transform(src, dest).apply(subject) == expected


def test_transform_refuses_subjects_it_does_not_match() -> None:
    t = compile_transform("a.*", "b.$1")
    assert t.apply("a.x") == "b.x"
    assert t.apply("a.x.y") is None
    assert t.apply("b.x") is None
    assert t.apply("a.*") is None  # a wildcard token is not a literal subject
    assert t.apply("a..") is None


def test_split_that_leaves_nothing_gives_an_undeliverable_subject() -> None:
    assert compile_transform("sp.*", "sp.{{split(1,-)}}").apply("sp.---") == "sp."


def test_fnv1a32_known_vectors() -> None:
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


def test_partition_hashes_utf8_bytes() -> None:
    t = compile_transform("p.*", "{{partition(1000,1)}}")
    assert t.apply("p.é") == str(fnv1a32("é".encode()) % 1000)


@pytest.mark.parametrize(("src", "dest", "message"), [
    ("a.*", "b.{{wildcard(2)}}",
     "invalid mapping destination: wildcard index out of range in {{wildcard(2)}}: [2]"),
    ("a.>", "b", "invalid subject"),
    ("a", "b.*", "invalid subject"),
    ("a.*", "{{nope(1)}}", "invalid mapping destination: unknown function in {{nope(1)}}"),
    ("a.*", "{{split(1)}}",
     "invalid mapping destination: not enough arguments passed to the function in {{split(1)}}"),
    ("a.*", "{{wildcard(1,2)}}",
     "invalid mapping destination: too many arguments passed to the function in "
     "{{wildcard(1,2)}}"),
    ("a.*", "{{wildcard(x)}}",
     "invalid mapping destination: function argument is invalid or in the wrong format in "
     "{{wildcard(x)}}"),
    ("a", "{{wildcard(1)}}",
     "invalid mapping destination: wildcard index out of range in {{wildcard(1)}}"),
    ("a.*", "x..y", "invalid mapping destination: invalid transform"),
    ("a.*", "x.>.y", "invalid mapping destination: invalid transform in y"),
    ("a.*", "x y", "invalid mapping destination: invalid transform"),
    ("a.*", "x.{{SPLIT(1,-)}}", "invalid mapping destination: unknown function in {{SPLIT(1,-)}}"),
    ("a.*", "", "invalid mapping destination: empty destination"),
])
def test_destination_errors_are_nats_servers(src: str, dest: str, message: str) -> None:
    with pytest.raises(MappingError) as e:
        validate_mapping_destination(src, dest)
    assert str(e.value) == message


def test_strict_transforms_for_imports() -> None:
    with pytest.raises(MappingError, match="only mapping function allowed for import"):
        compile_transform("foo.*", "bar.{{partition(2,1)}}", strict=True)
    with pytest.raises(MappingError, match="not using all of the token wildcard"):
        compile_transform("foo.*.*", "bar.$1", strict=True)
    assert compile_transform("foo.*.*", "bar.$2.$1", strict=True).apply("foo.a.b") == "bar.b.a"


def test_reverse_transform_undoes_an_import_remap() -> None:
    forward = compile_transform("foo.*.*", tokenize_wildcards("bar.*.*"), strict=True)
    assert tokenize_wildcards("bar.*.x.*") == "bar.$1.x.$2"
    back = reverse_transform(forward)
    assert back.src == "bar.*.*"
    for subject in ("foo.a.b", "foo.one.two"):
        mapped = forward.apply(subject)
        assert mapped is not None and back.apply(mapped) == subject
    swapped = compile_transform("foo.*.*", "bar.$2.$1", strict=True)
    assert reverse_transform(swapped).apply("bar.b.a") == "foo.a.b"
    literal = compile_transform("foo", "bar", strict=True)
    assert reverse_transform(literal).apply("bar") == "foo"


def test_weighted_choice_is_deterministic_with_a_seed_and_keeps_the_remainder() -> None:
    m = build_mapping("w", [("w.a", 60, None), ("w.b", 25, None)])
    table = MappingTable([m])
    counts: dict[str, int] = {}
    rng = random.Random(3)
    for _ in range(10_000):
        landed = table.apply("w", rng) or "w"
        counts[landed] = counts.get(landed, 0) + 1
    assert set(counts) == {"w.a", "w.b", "w"}
    assert abs(counts["w.a"] - 6000) < 250 and abs(counts["w.b"] - 2500) < 250
    again = MappingTable([m])
    rng1, rng2 = random.Random(9), random.Random(9)
    assert [table.apply("w", rng1) for _ in range(50)] == [again.apply("w", rng2)
                                                           for _ in range(50)]


def test_cluster_scoped_destinations_replace_the_unscoped_ones() -> None:
    m = build_mapping("c", [("c.west", 100, "west"), ("c.any", 100, None)])
    table = MappingTable([m])
    assert table.apply("c", cluster="west") == "c.west"
    assert table.apply("c", cluster="east") == "c.any"
    assert table.apply("c") == "c.any"
    only_west = MappingTable([build_mapping("d", [("d.west", 100, "west")])])
    assert only_west.apply("d", cluster="east") is None


def test_weights_are_checked_per_cluster_and_destinations_are_unique() -> None:
    build_mapping("w", [("a", 60, "x"), ("b", 60, "y")])
    with pytest.raises(MappingError, match=r'^Error adding mapping for "w" : total weight'):
        build_mapping("w", [("a", 60, "x"), ("b", 60, "x")])
    with pytest.raises(MappingError, match='duplicate entry for "a"'):
        build_mapping("w", [("a", 50, "x"), ("a", 40, "y")])
    with pytest.raises(MappingError, match=r'for "a\.\*" to "b\.\$2" : invalid mapping'):
        build_mapping("a.*", [("b.$2", 100, None)], single=True)


def test_first_matching_mapping_applies_once() -> None:
    table = MappingTable([build_mapping("a", [("b", 100, None)]),
                          build_mapping("b", [("c", 100, None)]),
                          build_mapping("x.*", [("y.$1", 100, None)])])
    assert table.apply("a") == "b"  # not then "c": mappings are not recursive
    assert table.apply("x.1") == "y.1"
    assert table.apply("q") is None
    table.add(build_mapping("a", [("z", 100, None)]))  # a new entry for a source replaces it
    assert table.apply("a") == "z" and len(table) == 3


def test_random_function_uses_the_given_rng() -> None:
    t = compile_transform("t.*", "t.{{random(4)}}")
    seen = {t.apply("t.x", random.Random(s)) for s in range(50)}
    assert seen == {"t.0", "t.1", "t.2", "t.3"}


def _token_soup():
    from hypothesis import strategies as st

    tokens = st.sampled_from(["a", "b", "*", ">", "", "$1", "$2", "$x", "{{wildcard(1)}}",
                              "{{partition(3,1,2)}}", "{{split(1,-)}}", "{{splitfromleft(1,2)}}",
                              "{{slicefromright(2,1)}}", "{{left(1,x)}}", "{{random(5)}}",
                              "{{wildcard()}}", "{{nope(1)}}", "{{", "}}", "a b", "é"])
    return st.lists(tokens, min_size=0, max_size=5).map(".".join)


def test_fuzz_transforms_only_raise_mapping_errors_and_apply_never_raises() -> None:
    from hypothesis import given, settings

    @settings(max_examples=800, deadline=None)
    @given(_token_soup(), _token_soup(), _token_soup())
    def check(src: str, dest: str, subject: str) -> None:
        try:
            t = validate_mapping_destination(src, dest)
        except MappingError:
            return
        out = t.apply(subject, random.Random(1))
        assert out is None or isinstance(out, str)

    check()
