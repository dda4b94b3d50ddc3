"""S3 refusals no restart can change end the job once, naming the permission or bucket (moto's S3 server).

moto enforces IAM policies once its unauthenticated allowance is used up: the trainer then runs as an IAM
user whose policy grants only some of the permissions docs/install.md lists, as a pod whose role lacks
one does on EKS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from blackwell_operator.lifecycle.failures import is_permanent
from blackwell_trainer.cloud_errors import PermanentCloudError
from blackwell_trainer.plan.config import DatasetConfig

from .test_train_e2e import edit_plan, run_one_process, write_plan

BUCKET = "training-data"


@dataclass
class S3:
    endpoint: str
    admin: Any  # a boto3 client with every permission (the test's own)
    monkeypatch: pytest.MonkeyPatch

    def run_as(self, *statements: dict[str, Any]) -> None:
        """From now on boto3 (this process and its children) is an IAM user allowed only `statements`."""
        import boto3
        import moto.settings

        iam = boto3.client("iam", endpoint_url=self.endpoint)
        user = f"trainer-{len(statements)}-{id(statements)}"
        iam.create_user(UserName=user)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", **s} for s in statements]}
        iam.put_user_policy(UserName=user, PolicyName="trainer", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        self.monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        self.monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        # boto3's default session keeps the credentials it read first: read the new ones.
        self.monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
        # The server runs in this process: from here on it checks every request against IAM.
        self.monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[S3]:
    """A moto server on a free loopback port, bucket BUCKET holding two token shards under `tokens/`."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "BTJ_CACHE_DIR": str(tmp_path / "cache"),
        "BTJ_CACHE_KEEP_FREE_FRACTION": "0",
    }.items():
        monkeypatch.setenv(name, value)
    admin = boto3.client("s3", endpoint_url=endpoint)
    admin.create_bucket(Bucket=BUCKET)
    tokens = np.arange(4096, dtype=np.uint32) % 250
    for index in range(2):
        admin.put_object(Bucket=BUCKET, Key=f"tokens/shard-{index}.bin", Body=tokens.tobytes())
    yield S3(endpoint, admin, monkeypatch)
    server.stop()


# AWS authorizes ListObjectsV2 as s3:ListBucket on the bucket (the S3 API reference, "ListObjectsV2":
# "you must have permission to perform the s3:ListBucket action"), and so do moto releases up to 5.2.5;
# moto 5.2.6 checks a policy for an action named s3:ListObjectsV2 instead, which IAM does not have. The
# tests grant (and the listing test withholds) both names, so what they check is the trainer's message
# for a refused listing, whichever name the emulator asks the policy for.
LIST_ACTIONS = ["s3:ListBucket", "s3:ListObjectsV2"]
LIST = {"Action": LIST_ACTIONS, "Resource": f"arn:aws:s3:::{BUCKET}"}
READ = {"Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/*"}


def _list_shards(uri: str) -> Any:
    from blackwell_trainer.data.tokens import list_shards

    return list_shards(DatasetConfig(kind="shards", uri=uri, tokenDtype="uint32"))


def test_a_missing_list_permission_is_named(s3: S3) -> None:
    s3.run_as(READ)
    with pytest.raises(PermanentCloudError) as caught:
        _list_shards(f"s3://{BUCKET}/tokens")
    assert str(caught.value) == (
        f"dataset.uri s3://{BUCKET}/tokens: AccessDenied on ListObjectsV2: the pod's role lacks "
        f"s3:ListBucket on arn:aws:s3:::{BUCKET}. Fix: grant s3:ListBucket on arn:aws:s3:::{BUCKET} to the "
        "IAM role of spec.serviceAccountName (docs/install.md §3)"
    )


def test_a_missing_read_permission_is_named_when_the_shard_is_fetched(s3: S3) -> None:
    s3.run_as(LIST)
    shards, _ = _list_shards(f"s3://{BUCKET}/tokens")
    assert [s.name for s in shards] == ["shard-0.bin", "shard-1.bin"]  # listing is allowed
    with pytest.raises(PermanentCloudError, match=r"lacks s3:GetObject on arn:aws:s3:::training-data/tok"):
        shards[0].fetch()


def test_a_missing_bucket_is_named(s3: S3) -> None:
    with pytest.raises(PermanentCloudError) as caught:
        _list_shards("s3://no-such-bucket/tokens")
    assert str(caught.value).startswith(
        "dataset.uri s3://no-such-bucket/tokens: bucket 'no-such-bucket' does not exist (NoSuchBucket on "
        "ListObjectsV2). Fix: create it, or correct dataset.uri"
    )


def test_credentials_aws_does_not_accept_are_named(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    import moto.settings

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # "testing" is no IAM key
    with pytest.raises(PermanentCloudError, match=r"AWS does not accept the pod's credentials \(InvalidAcc"):
        _list_shards(f"s3://{BUCKET}/tokens")


def test_a_server_error_stays_retryable() -> None:
    """Throttling and 5xx answers are not permanent: boto3 retries them, then the pod's restart does."""
    from botocore.exceptions import ClientError

    from blackwell_trainer.cloud_errors import permanent

    for code in ("SlowDown", "InternalError", "ServiceUnavailable", "NoSuchKey", "RequestTimeout"):
        err = ClientError({"Error": {"Code": code, "Message": "x"}}, "GetObject")
        assert permanent(err, "dataset.uri", "s3://b/k") is None, code


def test_an_export_without_delete_permission_is_permanent(s3: S3, tmp_path: Path) -> None:
    """The export removes an earlier export's files it did not write: that needs s3:DeleteObject."""
    from blackwell_trainer.weights.export import S3Destination

    s3.admin.put_object(Bucket=BUCKET, Key="out/model-00001-of-00002.safetensors", Body=b"old")
    s3.run_as(LIST, READ, {"Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{BUCKET}/*"})
    destination = S3Destination(f"s3://{BUCKET}/out", tmp_path / "staging")
    destination.write("config.json", lambda path: path.write_text("{}"))  # PutObject is granted
    with pytest.raises(
        PermanentCloudError, match=r"lacks s3:DeleteObject on arn:aws:s3:::training-data/out/"
    ):
        destination.commit({"config.json"})


def test_an_export_without_put_permission_is_permanent(s3: S3, tmp_path: Path) -> None:
    from blackwell_trainer.weights.export import S3Destination

    s3.run_as(LIST, READ)
    destination = S3Destination(f"s3://{BUCKET}/out", tmp_path / "staging")
    with pytest.raises(
        PermanentCloudError, match=r"lacks s3:PutObject on arn:aws:s3:::training-data/out/config"
    ):
        destination.write("config.json", lambda path: path.write_text("{}"))


def test_the_trainer_ends_once_with_a_permanent_error_the_operator_fails_the_job_on(
    s3: S3, tmp_path: Path
) -> None:
    """The real entry point: no traceback, exit 2, and a termination message the operator stops on."""
    plan = write_plan(tmp_path / "run", steps=2, shardDegree=1)

    def to_s3(p: dict[str, Any]) -> None:
        p["gpusPerNode"] = 1  # one process, no torchrun: the refusal comes before any collective
        p["dataset"].update(kind="shards", uri=f"s3://{BUCKET}/tokens", tokenDtype="uint32")

    edit_plan(plan, to_s3)
    s3.run_as(LIST)  # the pod's role may list the data but not read it
    termination = tmp_path / "termination-log"
    refused = run_one_process(plan, termination)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr, refused.stderr[-3000:]
    message = termination.read_text()
    assert message.startswith(f"permanent error: dataset.uri s3://{BUCKET}/tokens/shard-"), message
    assert "lacks s3:GetObject" in message and "spec.serviceAccountName" in message
    assert is_permanent({"message": message})  # the operator fails the BTJ once, no pod restarts
