"""`ImageJobs`: a run's image preparations; one image runs in the calling thread, more go to the pool."""
import threading

import pytest

from appliance.stages.chat.prompt import ImageJobs
from appliance.vision.preprocess_executor import PreprocessExecutor


def where(tag):
    return tag, threading.get_ident()


@pytest.fixture
def pool():
    with PreprocessExecutor(workers=2) as p:
        yield p


def test_a_single_image_is_prepared_in_the_calling_thread(pool):
    jobs = ImageJobs(pool)
    future = jobs.add(where, "only")
    assert not future.done()  # held back: a second image could still come
    jobs.run_held()
    assert future.result() == ("only", threading.get_ident())


def test_two_or_more_images_are_all_prepared_in_the_pool(pool):
    jobs = ImageJobs(pool)
    futures = [jobs.add(where, tag) for tag in ("a", "b", "c")]
    jobs.run_held()  # nothing is held once a second image came
    results = [f.result(timeout=10) for f in futures]
    assert [tag for tag, _ in results] == ["a", "b", "c"]
    assert all(thread != threading.get_ident() for _, thread in results)


def test_errors_reach_the_waiter_and_a_cancelled_image_never_runs(pool):
    def fail():
        raise ValueError("bad image")

    jobs = ImageJobs(pool)
    future = jobs.add(fail)
    jobs.run_held()
    with pytest.raises(ValueError, match="bad image"):
        future.result()
    ran = []
    jobs = ImageJobs(pool)
    held = jobs.add(ran.append, "held")
    held.cancel()  # a later request of the run was refused
    jobs.run_held()
    assert held.cancelled() and ran == []
