"""The GPU-utilisation sampler, driven by a fake reader (this machine has no GPU)."""

import time

from altscale.callbacks.gpu_utilization import UtilizationSampler, default_reader


def test_samples_until_stopped_and_averages():
    values = iter([10.0, 30.0, 50.0, 70.0] + [90.0] * 1000)
    sampler = UtilizationSampler(read=lambda: next(values), interval_s=0.01)
    sampler.start()
    time.sleep(0.2)
    samples = sampler.stop()
    assert samples[:4] == [10.0, 30.0, 50.0, 70.0]
    count = len(samples)
    time.sleep(0.05)
    assert len(sampler.samples) == count  # the thread has really stopped
    assert sampler.mean == sum(samples) / count


def test_a_failing_reader_ends_sampling_not_the_run():
    calls = []

    def read():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("NVML went away")
        return 50.0

    sampler = UtilizationSampler(read=read, interval_s=0.01)
    sampler.start()
    time.sleep(0.1)
    assert sampler.stop() == [50.0, 50.0] and sampler.mean == 50.0


def test_without_a_gpu_there_is_no_reader_and_no_mean():
    assert default_reader() is None
    sampler = UtilizationSampler()
    sampler.start()
    assert sampler.stop() == [] and sampler.mean is None
