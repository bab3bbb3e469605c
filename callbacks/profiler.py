"""torch.profiler over a few optimizer steps, to see where a step's time goes (recipe key `profile_steps`).

Profiling starts after optimizer step 2 (start-up and warm-up are over) and covers `num_steps` steps,
data loading included: the Trainer fetches a step's micro-batches before its first forward. It writes
`profile.txt` (the top operators by host time, inclusive and self, and by device time) and `trace.json.gz` (for Perfetto or
chrome://tracing) under `<output_dir>/profile/`, on the main process only.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import TrainerCallback

START_AFTER_STEP = 2


class ProfilerCallback(TrainerCallback):
    def __init__(self, num_steps: int, output_dir: str | Path, row_limit: int = 30) -> None:
        self.num_steps = num_steps
        self.output_dir = Path(output_dir) / "profile"
        self.row_limit = row_limit
        self.report: Path | None = None
        self._profile: torch.profiler.profile | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if state.global_step == START_AFTER_STEP and self._profile is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(activities=activities)
            self._profile.start()
        elif self._profile is not None and state.global_step == START_AFTER_STEP + self.num_steps:
            self._finish(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self._profile is not None:  # training ended before the last profiled step
            self._finish(state.global_step)

    def _finish(self, step: int) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        profile, self._profile = self._profile, None
        profile.stop()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        averages = profile.key_averages()
        tables = [f"optimizer steps {START_AFTER_STEP + 1}..{step}\n",
                  "by host time, callees included (DataLoader waits, Trainer phases):",
                  averages.table(sort_by="cpu_time_total", row_limit=self.row_limit),
                  "by host (self CPU) time:", averages.table(sort_by="self_cpu_time_total", row_limit=self.row_limit)]
        if torch.cuda.is_available():
            tables += ["by device time:", averages.table(sort_by="self_device_time_total", row_limit=self.row_limit)]
        self.report = self.output_dir / "profile.txt"
        self.report.write_text("\n".join(tables) + "\n")
        profile.export_chrome_trace(str(self.output_dir / "trace.json.gz"))
        print(f"profile of optimizer steps {START_AFTER_STEP + 1}..{step} written to {self.output_dir}", flush=True)
