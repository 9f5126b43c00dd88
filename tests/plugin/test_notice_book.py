"""The notice book and the feature test for posting into a session: each job's end is taken
(told) once among many threads; posting is used only where inject_message takes a session_key
(newer gateways), never with 0.19.0's."""

from __future__ import annotations

import stat
import threading

from hermes_bulk.plugin import hermes, notices


def test_each_end_is_taken_once_among_threads_and_the_book_is_owner_only(tmp_path):
    profile = str(tmp_path / "home")
    notices.watch(profile, "job1", "")
    notices.watch(profile, "job2", "agent:main:telegram:dm:42")
    assert notices.watched(profile) == {"job1": "", "job2": "agent:main:telegram:dm:42"}
    taken: list[bool] = []
    threads = [
        threading.Thread(target=lambda: taken.append(notices.take(profile, "job1")))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert taken.count(True) == 1
    assert notices.watched(profile) == {"job2": "agent:main:telegram:dm:42"}
    book = tmp_path / "home" / "plugin-data" / "bulk" / "notices.json"
    assert stat.S_IMODE(book.stat().st_mode) == 0o600
    book.write_text("{torn")
    assert notices.watched(profile) == {}, "a torn book starts afresh, the reply still goes out"


def test_posting_is_used_only_where_inject_message_takes_a_session_key():
    posted: list[tuple[str, str]] = []

    class Newer:
        def inject_message(self, content, role="user", *, session_key=None):
            posted.append((content, session_key))
            return True

    class Old:  # 0.19.0: no session_key, and False in the gateway
        def inject_message(self, content, role="user"):
            return False

    assert hermes.can_post_to_session(Newer()) and not hermes.can_post_to_session(Old())
    assert not hermes.can_post_to_session(object())
    assert hermes.post_to_session(Newer(), "Job x ended", "agent:main:tui:1")
    assert posted == [("Job x ended", "agent:main:tui:1")]

    class Refusing:
        def inject_message(self, content, role="user", *, session_key=None):
            raise PermissionError("allow_gateway_injection is off")

    assert hermes.post_to_session(Refusing(), "Job x ended", "k") is False


def test_the_book_is_never_written_through_a_link_and_its_folders_are_owner_only(tmp_path):
    profile = tmp_path / "home"
    notices.watch(str(profile), "job1")
    for folder in (profile, profile / "plugin-data", profile / "plugin-data" / "bulk"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    book = profile / "plugin-data" / "bulk" / "notices.json"
    book.unlink()
    target = tmp_path / "elsewhere.txt"
    target.write_text("someone else's file")
    book.symlink_to(target)
    notices.watch(str(profile), "job2")
    assert notices.watched(str(profile)) == {} and not notices.take(str(profile), "job2")
    assert target.read_text() == "someone else's file" and book.is_symlink()
    book.unlink()
    book.write_text('{"job3": ""}')
    book.chmod(0o644)
    notices.watch(str(profile), "job4")
    assert notices.watched(str(profile)) == {"job3": "", "job4": ""}
    assert stat.S_IMODE(book.stat().st_mode) == 0o600


def test_the_same_job_watched_again_from_another_session_is_told_once_there(tmp_path):
    profile = str(tmp_path / "home")
    notices.watch(profile, "job1", "agent:main:telegram:dm:1")
    notices.watch(profile, "job1", "agent:main:tui:2")  # /bulk run job1 again, elsewhere
    assert notices.watched(profile) == {"job1": "agent:main:tui:2"}, "one entry, the latest"
    notices.watch(profile, "job1", "")  # and from a session that cannot be posted into
    assert notices.watched(profile) == {"job1": ""}
    assert notices.take(profile, "job1") is True
    assert notices.take(profile, "job1") is False, "told once, however often it was watched"
    notices.watch(profile, "job1", "agent:main:tui:2")  # run again after its end was told
    assert notices.take(profile, "job1") is True, "a new run's end is news again"


def test_a_keyed_job_is_taken_and_others_are_left_alone(tmp_path):
    profile = str(tmp_path / "home")
    assert notices.take(profile, "job1") is False and notices.watched(profile) == {}
    notices.unwatch(profile, "job1")  # nothing to unwatch: no book is made
    assert not (tmp_path / "home").exists()
    notices.watch(profile, "job1", "agent:main:tui:1")
    notices.watch(profile, "job2", "")
    assert notices.take(profile, "job3") is False
    assert notices.take(profile, "job1") is True
    notices.unwatch(profile, "job2")
    notices.unwatch(profile, "job2")
    assert notices.watched(profile) == {}


def test_reading_the_book_writes_nothing_and_a_change_writes_it_sorted(tmp_path):
    profile = str(tmp_path / "home")
    notices.watch(profile, "job1")
    book = tmp_path / "home" / "plugin-data" / "bulk" / "notices.json"
    book.write_text('{ "job1" : "" }')  # as a hand would write it
    before = book.stat().st_mtime_ns
    assert notices.watched(profile) == {"job1": ""}
    assert notices.take(profile, "job9") is False
    notices.unwatch(profile, "job9")
    assert book.read_text() == '{ "job1" : "" }' and book.stat().st_mtime_ns == before
    notices.watch(profile, "job0", "k")
    assert book.read_text() == '{"job0": "k", "job1": ""}'
