"""The flow tests of tests/flow/test_flow.py, run on the virtual board (real sshd, own user, netns)."""

from __future__ import annotations

import pytest

from tests.flow.teacher_nights import (  # noqa: F401
    test_a_teacher_labels_two_nights_of_unlabeled_board_data,
)
from tests.flow.test_flow import (  # noqa: F401 - collected here with the fixtures below
    prepared_ssd_flow,
    promoted_run,
    test_detector_with_its_loss_in_the_graph_completes,
    test_failing_run_loses_nothing_promoted,
    test_first_run_is_promoted_with_report_and_progress,
    test_foreign_onnx_model_is_fine_tuned_and_quantized,
    test_rerun_is_judged_by_the_promotion_gate,
    test_run_forced_to_lose_keeps_current_and_reuses_cache,
)
from tests.flow.test_foreign_models import (  # noqa: F401
    test_avg_pool_after_frozen_batchnorm_trains_on_the_board,
    test_foreign_onnx_sharing_initializers_across_the_cut_completes,
)
from tests.flow.test_nightly import (  # noqa: F401
    test_nightly_cycles_promote_reject_rollout_and_rollback,
)
from tests.flow.test_segmentation import (  # noqa: F401
    segmentation_run,
    test_a_background_only_candidate_is_rejected_with_its_miou_interval,
    test_segmentation_is_promoted_on_a_significant_miou_gain,
)

pytestmark = [pytest.mark.slow, pytest.mark.board]


@pytest.fixture(scope="module")
def flow_home(virtual_board, virtual_board_home):
    """ODL_HOME pointed at the virtual board's home (inventory, keys, registry) for this module."""
    from tests.fixtures_board import odl_home_env

    with odl_home_env(virtual_board_home):
        yield virtual_board_home


@pytest.fixture(scope="module")
def flow_board(virtual_board, flow_home):
    """The virtual board of the session."""
    return virtual_board
