"""Names are validated before they become part of a Redis key."""

import pytest

from echomq_django.core import InvalidNameError, Queue, QueueKeys, validate_job_id


def test_every_key_of_a_queue_carries_the_hash_tag():
    keys = QueueKeys("mail", "emq")
    assert keys.wait == "emq:{mail}:wait"
    assert keys.stalled_check == "emq:{mail}:stalled-check"
    assert keys.job("42") == "emq:{mail}:42"
    assert keys.lock("42") == "emq:{mail}:42:lock"


@pytest.mark.parametrize("name", ["a{b", "a}b", "a:b", "a b", "tab\there", "nl\n", "nul\x00", "", "x" * 129])
def test_bad_queue_names_are_refused(name):
    with pytest.raises(InvalidNameError):
        QueueKeys(name)


@pytest.mark.parametrize("job_id", ["wait", "active", "stalled-check", "12", "a:b", "{x}", " ", "y" * 200])
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
    mine, other = Queue("a*", redis_client, prefix=prefix), Queue("ab", redis_client, prefix=prefix)
    mine.add("x")
    other.add("x")
    mine.obliterate()
    assert other.counts()["wait"] == 1
    assert list(redis_client.scan_iter(match=f"{prefix}:{{a\\*}}:*")) == []
