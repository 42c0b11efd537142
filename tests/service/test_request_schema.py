"""The API's view of a job's request is a projection of the one request type, never a second definition."""

from __future__ import annotations

import dataclasses

from rlsched.runtime.job_request import JobRequest
from rlsched.service.api import RequestView


def test_every_request_view_field_is_a_job_request_field_of_the_same_default() -> None:
    fields = {f.name: f for f in dataclasses.fields(JobRequest)}
    for name, info in RequestView.model_fields.items():
        assert name in fields, f"RequestView.{name} is not a JobRequest field"
        f = fields[name]
        if f.default is not dataclasses.MISSING:
            assert info.default == f.default, f"RequestView.{name} defaults differ from JobRequest's"
