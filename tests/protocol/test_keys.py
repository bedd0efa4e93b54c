"""Names are validated before they become part of a Redis key."""

import pytest

from echomq_django.core import InvalidNameError, Queue, QueueKeys, validate_job_id


def test_every_key_of_a_queue_carries_the_hash_tag():
    keys = QueueKeys("mail", "emq")
    assert keys.wait == "emq:{mail}:wait"
    assert keys.stalled_check == "emq:{mail}:stalled-check"
    assert keys.job("42") == "emq:{mail}:42"
    assert keys.lock("42") == "emq:{mail}:42:lock"


@pytest.mark.parametrize("name", [
    "a{b", "a}b", "a:b", "a b", "tab\there", "nl\n", "nul\x00", "", "x" * 129,
    # URL syntax: these names become admin URL path segments.
    "a/b", "a?b", "a#b", "a%2Fb", ".", "..", "-flag",
    # Look the same as a harmless name, or reorder what is shown around them.
    "mail\u200b", "\u202eliam", "m\u0430il", "lone\ud800", "caf\u00e9",
])
def test_bad_queue_names_are_refused(name):
    with pytest.raises(InvalidNameError, match="may hold only|empty|limit"):
        QueueKeys(name)


@pytest.mark.parametrize("name", ["mail", "q", "invoice-2026.12", "user@example.com", "a+b=c", "_private", "9lives"])
def test_names_of_the_alphabet_are_accepted(name):
    assert QueueKeys(name).queue == name
    assert validate_job_id(name) == name or name.isdigit()


@pytest.mark.parametrize("job_id", ["wait", "active", "stalled-check", "12", "a:b", "{x}", " ", "y" * 200,
                                    "../admin", "a/b", "a?b", "a#b", "..", "id\u200b", "\u202eid"])
def test_bad_job_ids_are_refused(job_id):
    with pytest.raises(InvalidNameError):
        validate_job_id(job_id)


def test_refused_ids_build_no_key(redis_client, prefix):
    queue = Queue("q", redis_client, prefix=prefix)
    with pytest.raises(InvalidNameError, match="reserved"):
        queue.add("work", job_id="active")
    with pytest.raises(InvalidNameError):
        queue.get_job("a:b")
    assert list(redis_client.scan_iter(match=f"{prefix}:*")) == []


def test_obliterate_only_touches_its_own_queue(redis_client, prefix):
    mine, other = Queue("a", redis_client, prefix=prefix), Queue("ab", redis_client, prefix=prefix)
    mine.add("x")
    other.add("x")
    mine.obliterate()
    assert other.counts()["wait"] == 1
    assert list(redis_client.scan_iter(match=f"{prefix}:{{a}}:*")) == []


@pytest.mark.parametrize("name", ["send welcome", "tab\tname", "zero\u200bwidth", "\u202eevil", "lone\ud800", ""])
def test_bad_job_names_are_refused(redis_client, prefix, name):
    with pytest.raises(InvalidNameError):
        Queue("q", redis_client, prefix=prefix).add(name)
    assert list(redis_client.scan_iter(match=f"{prefix}:*")) == []


@pytest.mark.parametrize("name", ["myapp.jobs.send_welcome", "<b>shown-escaped</b>", "café.report"])
def test_job_names_are_not_held_to_the_key_alphabet(redis_client, prefix, name):
    queue = Queue("q", redis_client, prefix=prefix)
    assert queue.get_job(queue.add(name)).name == name
