"""Bus names: one check for the bus, the segment and the command line; ``Bus(name)`` only attaches (a missing
bus fails at construction, naming those that exist; ``create=True`` makes it); ``shmbus list`` shows each bus on
one line with its size, processes and age."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import shmbus
from shmbus.segment import Segment, segment_path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shmbus", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("suffix", ["\nfake", " x", "/x", "\x00", "\t", "é", "x" * 200])
def test_bad_bus_names_are_refused_everywhere(bus_name: str, suffix: str) -> None:
    name = bus_name + suffix
    with pytest.raises(shmbus.InvalidArgument, match="a bus name is 1-200 of the characters"):
        shmbus.Bus(name, create=True)
    with pytest.raises(shmbus.InvalidArgument, match="a bus name is"):
        Segment.open(name)
    with pytest.raises(shmbus.InvalidArgument, match="a bus name is"):
        Segment.destroy_by_name(name)
    if "\x00" not in name:  # argv cannot carry NUL
        r = _cli("publish", "/x", "1", "--bus", name, "--create")
        assert r.returncode != 0 and "a bus name is" in r.stderr and "Traceback" not in r.stderr
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"shmbus.{bus_name}")]


@pytest.mark.parametrize("name", ["-x", ".x", ""])
def test_names_that_read_as_options_or_hidden_files_are_refused(name: str) -> None:
    with pytest.raises(shmbus.InvalidArgument):
        shmbus.Bus(name, create=True)


def test_create_false_fails_at_construction_naming_the_buses_that_exist(make_bus: Any, bus_name: str) -> None:
    make_bus().publish("/x", 1)
    typo = bus_name + "typo"
    with pytest.raises(shmbus.BusNotFound) as info:
        shmbus.Bus(typo, create=False)  # not at first use: here
    assert isinstance(info.value, FileNotFoundError)
    assert f"no bus named {typo!r}" in str(info.value) and repr(bus_name) in str(info.value)
    assert not os.path.exists(segment_path(typo))
    assert shmbus.Bus(bus_name, create=False, keepalive_interval=0).last_id("/x") == 1


def test_a_typo_in_a_plain_bus_name_raises_instead_of_making_a_new_bus(make_bus: Any, bus_name: str) -> None:
    """Issue 34: ``Bus("myapq")`` made a new, empty 34.5 MiB bus; the default now only attaches."""
    make_bus().publish("/x", 1)
    typo = bus_name + "q"
    with pytest.raises(shmbus.BusNotFound) as info:
        shmbus.Bus(typo)
    says = str(info.value)
    assert f"no bus named {typo!r}" in says and repr(bus_name) in says and "create=True" in says
    assert not os.path.exists(segment_path(typo))
    attached = shmbus.Bus(bus_name, keepalive_interval=0)  # the name that exists: attached, not made again
    assert attached.create is False and attached.last_id("/x") == 1
    attached.close()


def test_create_true_makes_a_missing_bus_and_attaches_an_existing_one(bus_name: str) -> None:
    first = shmbus.Bus(bus_name, create=True, keepalive_interval=0)
    assert first.publish("/x", 1) == 1 and os.path.exists(segment_path(bus_name))
    again = shmbus.Bus(bus_name, create=True, keepalive_interval=0)  # a second run of the app: the same bus
    assert again.last_id("/x") == 1
    again.close()
    first.destroy()


def test_list_shows_size_processes_and_age_one_line_per_bus(make_bus: Any, bus_name: str) -> None:
    bus = make_bus()
    bus.publish("/x", 1)
    odd = segment_path(bus_name + "odd\nname")  # made by hand (or by an older shmbus): not a bus name
    with open(odd, "w") as f:
        f.write("not a segment")
    try:
        listed = {b["bus"]: b for b in json.loads(_cli("list", "--json").stdout)}
        mine = listed[bus_name]
        assert mine["size_bytes"] == os.path.getsize(segment_path(bus_name))
        assert mine["processes"] == [os.getpid()]  # this test; never the list command itself
        assert 0 <= mine["age_seconds"] < 300 and mine["problem"] is None
        assert "not a shmbus segment" in listed[bus_name + "odd\nname"]["problem"]
        text = _cli("list").stdout.splitlines()
        assert text[0].split() == ["bus", "size", "processes", "age"]
        row = next(line for line in text if line.split()[0] == bus_name).split()
        assert row[1:3] == [f"{os.path.getsize(segment_path(bus_name)) / 2**20:.1f}", "MiB"] and row[3] == "1"
        odd_rows = [line for line in text if line.startswith(bus_name + "odd")]
        assert len(odd_rows) == 1 and odd_rows[0].startswith(bus_name + "odd\\nname ")
        assert "unreadable" in odd_rows[0]
    finally:
        os.unlink(odd)


def test_destroy_refuses_a_file_that_is_not_a_segment_unless_forced(tmp_path: Any) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    r = _cli("destroy", "--path", str(notes))
    assert r.returncode != 0 and "not a shmbus segment" in r.stderr and "--force" in r.stderr
    assert notes.read_text() == "precious"
    r = _cli("destroy", "--path", str(tmp_path))  # a directory: refused, then a clear error even with --force
    assert r.returncode != 0 and "not a regular file" in r.stderr
    r = _cli("destroy", "--path", str(tmp_path), "--force")
    assert r.returncode != 0 and "cannot remove" in r.stderr and "Traceback" not in r.stderr
    assert _cli("destroy", "--path", str(notes), "--force").returncode == 0
    assert not notes.exists()


def test_destroy_never_follows_nor_removes_a_link(tmp_path: Any, bus_name: str) -> None:
    seg_file = tmp_path / "bus.seg"
    bus = shmbus.Bus(
        bus_name, path=str(seg_file), ring_size=1 << 16, max_channels=16, keepalive_interval=0, create=True
    )
    bus.publish("/x", 1)
    bus.close()
    link = tmp_path / "link"
    link.symlink_to(seg_file)
    shm_link = segment_path(bus_name)  # a link planted where the bus's segment would be
    os.symlink(seg_file, shm_link)
    try:
        for args in (["--path", str(link)], ["--path", str(link), "--force"], ["--bus", bus_name, "--force"]):
            r = _cli("destroy", *args)
            assert r.returncode != 0 and "symbolic link" in r.stderr, (args, r.stderr)
        assert link.is_symlink() and os.path.islink(shm_link) and seg_file.stat().st_size > 0
    finally:
        os.unlink(shm_link)
    r = _cli("destroy", "--path", str(seg_file), "--json")  # the segment itself, with nobody attached: removed
    assert r.returncode == 0 and json.loads(r.stdout)["destroyed"] is True and not seg_file.exists()


def _made(name: str) -> None:
    bus = shmbus.Bus(name, ring_size=1 << 16, max_channels=16, keepalive_interval=0, create=True)
    bus.publish("/x", 1)  # the segment is made on first use
    bus.close()


def test_destroy_says_what_it_destroyed(tmp_path: Any, bus_name: str) -> None:
    """``destroy --path X`` names the path it removed, not the default bus name it never touched; ``--bus`` names
    the bus and its segment; JSON carries the path too."""
    seg_file = tmp_path / "bus.seg"
    for args in (["--force"], []):
        bus = shmbus.Bus(
            bus_name, path=str(seg_file), ring_size=1 << 16, max_channels=16, keepalive_interval=0, create=True
        )
        bus.publish("/x", 1)
        bus.close()
        r = _cli("destroy", "--path", str(seg_file), *args)
        assert (r.returncode, r.stdout.strip()) == (0, f"destroyed the bus at {seg_file}"), r.stderr
        assert not seg_file.exists()
    r = _cli("destroy", "--path", str(seg_file))
    assert (r.returncode, r.stdout.strip()) == (1, f"no bus at {seg_file}")
    _made(bus_name)
    r = _cli("destroy", "--bus", bus_name, "--json")
    assert json.loads(r.stdout) == {"bus": bus_name, "path": segment_path(bus_name), "destroyed": True}
    r = _cli("destroy", "--bus", bus_name)
    assert r.returncode == 1 and r.stdout.startswith(f"no bus named {bus_name!r} ({segment_path(bus_name)})")
    _made(bus_name)
    r = _cli("destroy", "--bus", bus_name)
    assert (r.returncode, r.stdout.strip()) == (0, f"destroyed bus {bus_name!r} ({segment_path(bus_name)})")
