"""The measure of "Lightning's contract": Lightning's own tests run on tandem, with what is set aside and why.

    python docs/scripts/lightning_suite_rate.py LIGHTNING.xml TANDEM.xml

reads the two junit files of `../shared/lightning_suite/run.sh` (its `compare.py` gives the per-file table and the
worklist) and sorts every Lightning-passing test that fails on tandem into one of:

- internals: the failure names a Lightning internal. `compare.py` counts the shim's placeholders (`SHIM-MISSING`);
  INTERNALS below adds the ones the shim cannot mark, each checked by reading the test: a private attribute of a
  Lightning object that tandem has under its own name or not at all, the loop tree, the connectors, or a private
  Lightning function patched or attribute set by the test (which never reaches tandem, so it cannot measure it);
- a listed difference: a test id in DIFFERENCES, explained in docs/lightning.md's "Differences from Lightning";
- other: work left (printed).

The rate is the tests passing on tandem over the Lightning-passing tests that are not internals; listed
differences count as not passing.
"""

import re
import sys
import xml.etree.ElementTree as ET

# (pattern searched in the failure text, what the test reaches): each checked by reading the test
INTERNALS = [
    (r"'FitLoop' object has no attribute '(epoch_loop|total_batch_idx|max_steps)'", "Lightning's loop tree"),
    (r"Strategy' object has no attribute 'connect'", "strategy.connect() with trainer._data_connector"),
    (
        r"attribute '(_evaluate_stopping_criteria|_format_checkpoint_name|_link_checkpoint|_every_n_train_steps"
        r"|_checkpoint_connector|_save_topk_checkpoint|_find_last_checkpoints|_results|_total_batch_idx"
        r"|_current_fx_name)'",
        "a private method or attribute",
    ),
]
# test ids (prefix before any "[") whose outcome depends on patching or setting a private Lightning name
PATCHES_PRIVATE = {
    "trainer/test_dataloaders.py::test_warning_with_few_workers": "lightning.fabric.utilities.data._num_cpus_available",
    "trainer/test_dataloaders.py::test_warning_with_few_workers_multi_loader": (
        "lightning.fabric.utilities.data._num_cpus_available"
    ),
    "callbacks/test_early_stopping.py::test_early_stopping_no_extraneous_invocations": (
        "EarlyStopping._run_early_stopping_check, counted through a mock"
    ),
    "trainer/logging_/test_train_loop_logging.py::test_unsqueezed_tensor_logging": (
        "LightningModule._current_fx_name, set by hand to log outside a hook"
    ),
}
# test ids (prefix before any "[") that fail on purpose: docs/lightning.md says why
DIFFERENCES = {
    "checkpointing/test_model_checkpoint.py::test_checkpoint_repeated_strategy": "run folder tandem_logs",
    "checkpointing/test_model_checkpoint.py::test_checkpoint_repeated_strategy_extended": "run folder tandem_logs",
    "models/test_hooks.py::test_trainer_model_hook_system_fit": "which module hooks run; gradients cleared after the step",
    "models/test_hooks.py::test_trainer_model_hook_system_fit_no_val_and_resume_max_epochs": "which module hooks run",
    "models/test_hooks.py::test_trainer_model_hook_system_fit_no_val_and_resume_max_steps": "which module hooks run",
    "trainer/test_dataloaders.py::test_fit_multiple_train_loaders": (
        "num_training_batches after a fit refused for CombinedLoader(mode='sequential') (only that parameter fails)"
    ),
}


def outcomes(path: str) -> dict[str, tuple[bool, str]]:
    """{test id: (passed, failure text)}, as compare.py reads a junit file."""
    res: dict[str, tuple[bool, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        tid = file.split("tests_pytorch/")[-1] + "::" + case.get("name", "")
        bad = [c for c in case if c.tag in ("failure", "error", "skipped")]
        text = "\n".join((c.get("message", "") + "\n" + (c.text or "")) for c in bad)
        if tid not in res or res[tid][0]:
            res[tid] = (not bad, text)
    return res


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lightning, tandem = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    passing = [t for t, (ok, _) in lightning.items() if ok]
    counts = {"pass": 0, "shim": 0, "internals": 0, "patch": 0, "difference": 0, "other": 0}
    left = []
    for tid in passing:
        ok, text = tandem.get(tid, (False, "not run"))
        base = tid.split("[")[0]
        if ok:
            counts["pass"] += 1
        elif "SHIM-MISSING" in text:
            counts["shim"] += 1
        elif any(re.search(p, text) for p, _ in INTERNALS):
            counts["internals"] += 1
        elif base in PATCHES_PRIVATE:
            counts["patch"] += 1
        elif base in DIFFERENCES:
            counts["difference"] += 1
        else:
            counts["other"] += 1
            line = next((s.strip() for s in text.splitlines() if s.strip()), "")
            left.append(f"{tid}\n    {line[:200]}")
    scope = len(passing) - counts["shim"] - counts["internals"] - counts["patch"]
    print(
        f"Lightning passes {len(passing)}; tandem passes {counts['pass']}.\n"
        f"Set aside as internals: {counts['shim']} SHIM-MISSING, {counts['internals']} named internals, "
        f"{counts['patch']} patching a private function.\n"
        f"In scope {scope}: passing {counts['pass']} ({100 * counts['pass'] / scope:.1f}%), "
        f"listed differences {counts['difference']}, other {counts['other']}."
    )
    print("\n".join(left))


if __name__ == "__main__":
    main()
