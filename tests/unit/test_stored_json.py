"""decode_stored: JSON read back from Redis or a row, which anyone may have written, fails one way only."""

import pytest

from echomq_django.core import decode_stored


@pytest.mark.parametrize("text", ["[" * 5000, "{" * 5000, "NaN", '{"done": Infinity}', "[-Infinity]", "{not json",
                                  b"\xff", ""])
def test_every_text_that_is_no_json_of_ours_raises_value_error(text):
    with pytest.raises(ValueError):
        decode_stored(text)


def test_json_decodes_as_json():
    assert decode_stored('{"a": [1, 2.5, "é", null]}') == {"a": [1, 2.5, "é", None]}
    assert decode_stored(b'"text"') == "text"
