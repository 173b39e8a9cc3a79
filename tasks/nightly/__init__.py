"""What only nightly retraining needs: which files of the board's growing dataset a job trains on
(``board_data``). Talking to the board is :mod:`tasks.board`; the nightly stages (board data,
rollout, rollback) are :mod:`tasks.stages.nightly`."""
