"""Whom the progress board blames: the evidence rules of :func:`graphtrainer.heartbeat.find_stuck`,
on rows written through the same writer the ranks use."""
from __future__ import annotations

import array

import pytest

from graphtrainer import heartbeat


@pytest.fixture
def board():
    rows = array.array("d", [0.0] * (2 * heartbeat.FIELDS))
    yield rows
    heartbeat._writer = None


def _write(board, rank: int, place: str, batch: int = 0, waiting: bool = False, ago: float = 0.0) -> None:
    heartbeat.attach(board, rank)
    heartbeat._writer.beat(place, batch, waiting=waiting)
    board[rank * heartbeat.FIELDS] -= ago  # (the row's time of last progress)


def test_a_rank_in_backward_is_blamed_and_its_peer_in_the_gradient_all_reduce_is_not(board):
    _write(board, 0, "DDP's gradient all-reduce", 1, waiting=True, ago=11)
    _write(board, 1, "backward", 1, ago=12)
    stuck = heartbeat.find_stuck(heartbeat.read_board(board, 2), 10, 120, [0, 1])
    assert [p.rank for p in stuck] == [1]
    assert stuck[0].describe().startswith("rank 1 in backward (epoch 0, batch 1) for 12 s")


def test_a_stopped_rank_is_blamed_even_while_its_row_says_waiting(board):
    _write(board, 0, "barrier", waiting=True, ago=11)
    _write(board, 1, "barrier", waiting=True, ago=11)
    _write(board, 1, "barrier", waiting=True, ago=11)  # more progress: not the one behind
    places = heartbeat.read_board(board, 2)
    assert [p.rank for p in heartbeat.find_stuck(places, 10, 120, [0, 1])] == [0]
    assert [p.rank for p in heartbeat.find_stuck(places, 10, 120, [0, 1], stopped=[1])] == [1]


def test_a_stop_signal_shortens_the_timeout_between_batch_boundaries_only(board):
    _write(board, 0, "DDP's gradient all-reduce", 3, waiting=True, ago=2.5)
    _write(board, 1, "training_step", 3, ago=2.5)
    places = heartbeat.read_board(board, 2)
    assert heartbeat.find_stuck(places, 60, 120, [0, 1]) is None
    assert [p.rank for p in heartbeat.find_stuck(places, 60, 120, [0, 1], stop_asked=True)] == [1]
    heartbeat.attach(board, 1)
    heartbeat.stop_requested()  # what a rank's stop-signal handler records
    assert [p.rank for p in heartbeat.find_stuck(heartbeat.read_board(board, 2), 60, 120, [0, 1])] == [1]
    _write(board, 1, "save_checkpoint", ago=2.5)  # a checkpoint being written: no boundary awaited
    assert heartbeat.find_stuck(heartbeat.read_board(board, 2), 60, 120, [0, 1]) is None


def test_the_shortened_timeout_grows_with_the_longest_pause_seen(board):
    heartbeat.attach(board, 1)
    heartbeat._writer.beat("training_step", 0)
    board[heartbeat.FIELDS] -= 5.0  # a 5 s step
    heartbeat._writer.beat("backward", 0)
    place = heartbeat.read_board(board, 2)[1]
    assert place.longest_s == pytest.approx(5.0, abs=0.5)
    assert heartbeat.timeout_after_stop(place, 60) == pytest.approx(2 * place.longest_s)
    assert heartbeat.timeout_after_stop(place, 7) == 7
