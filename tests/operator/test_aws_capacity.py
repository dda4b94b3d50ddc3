"""HyperPod capacity from AWS into CapacityAvailable: moto's server for the calls it implements
(DescribeCluster, ListClusterNodes), botocore's Stubber with the real service model for the rest
(DescribeTrainingPlan, pagination, throttling, access denied, not found)."""

from __future__ import annotations

import datetime
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from blackwell_operator.discovery.aws import IAM_ACTIONS, HyperPodCapacityReader, split_name
from blackwell_operator.lifecycle.capacity import with_aws_capacity
from blackwell_operator.lifecycle.conditions import ConditionChange
from tests.operator.harness import Cluster, btj, running_operator, wait_for

REGION = "us-east-1"
P5 = "ml.p5.48xlarge"
B200 = "ml.p6-b200.48xlarge"


@pytest.fixture
def moto_sagemaker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's server on a loopback port with HyperPod cluster `ml-cluster`: 4 P5 nodes in group workers."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # moto keeps its state per process: start from an empty account (its reset endpoint).
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    client = boto3.client("sagemaker", region_name=REGION)
    client.create_cluster(
        ClusterName="ml-cluster",
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": P5,
                "InstanceCount": 4,
                "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle/", "OnCreate": "on_create.sh"},
                "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
                "ThreadsPerCore": 1,
            }
        ],
        VpcConfig={"SecurityGroupIds": ["sg-12345678"], "Subnets": ["subnet-12345678"]},
    )
    yield client
    server.stop()


def test_moto_cluster_groups_and_running_nodes(moto_sagemaker: Any) -> None:
    reader = HyperPodCapacityReader(lambda region: moto_sagemaker)
    answer = reader.read("ml-cluster", P5, 2)
    assert answer.known and not answer.short and answer.reason == "Sufficient"
    assert (
        answer.message
        == "HyperPod cluster ml-cluster, instance group workers: 4 of 4 nodes running; 2 needed."
    )
    short = reader.read("ml-cluster", P5, 8)
    assert short.short and short.reason == "InstanceGroupShort"
    missing = reader.read("ml-cluster", B200, 2)
    assert missing.short and missing.reason == "NoInstanceGroup"
    assert (
        "no instance group of ml.p6-b200.48xlarge (its groups: workers (ml.p5.48xlarge))" in missing.message
    )


def stubbed() -> tuple[Any, Stubber]:
    client = boto3.client(
        "sagemaker", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    return client, Stubber(client)


def cluster_response(target: int = 4, plan_arn: str | None = None) -> dict[str, Any]:
    group: dict[str, Any] = {
        "InstanceGroupName": "b200",
        "InstanceType": B200,
        "CurrentCount": 2,
        "TargetCount": target,
        "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle/", "OnCreate": "on_create.sh"},
    }
    if plan_arn:
        group["TrainingPlanArn"] = plan_arn
    return {
        "ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/abcdef123456",
        "ClusterName": "ml-cluster",
        "ClusterStatus": "InService",
        "InstanceGroups": [group],
    }


def node(name: str, status: str, group: str = "b200") -> dict[str, Any]:
    return {
        "InstanceGroupName": group,
        "InstanceId": name,
        "InstanceType": B200,
        "LaunchTime": datetime.datetime(2026, 11, 30, tzinfo=datetime.UTC),
        "InstanceStatus": {"Status": status, "Message": ""},
    }


def test_running_nodes_across_pages_and_a_scheduled_plan() -> None:
    client, stub = stubbed()
    plan_arn = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p6-december"
    stub.add_response("describe_cluster", cluster_response(4, plan_arn), {"ClusterName": "ml-cluster"})
    group = {"ClusterName": "ml-cluster", "InstanceGroupNameContains": "b200"}
    stub.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [node("i-1", "Running"), node("i-2", "Pending")], "NextToken": "page2"},
        group,
    )
    stub.add_response(
        "list_cluster_nodes",
        # A longer group name that contains ours is not ours.
        {"ClusterNodeSummaries": [node("i-3", "Running"), node("i-9", "Running", group="b200-spare")]},
        {**group, "NextToken": "page2"},
    )
    stub.add_response(
        "describe_training_plan",
        {
            "TrainingPlanArn": plan_arn,
            "TrainingPlanName": "p6-december",
            "Status": "Scheduled",
            "StartTime": datetime.datetime(2026, 12, 2, 8, 0, tzinfo=datetime.UTC),
            "EndTime": datetime.datetime(2026, 12, 9, 8, 0, tzinfo=datetime.UTC),
        },
        {"TrainingPlanName": "p6-december"},  # the instance group's plan, read by name
    )
    with stub:
        answer = HyperPodCapacityReader(lambda region: client).read("ml-cluster", B200, 2)
        stub.assert_no_pending_responses()
    assert answer.known and answer.short and answer.reason == "TrainingPlanNotActive"
    assert answer.message == (
        "HyperPod cluster ml-cluster, instance group b200: 2 of 4 nodes running; 2 needed; training plan "
        "p6-december is Scheduled: it starts at 2026-12-02T08:00:00Z and ends at 2026-12-09T08:00:00Z. "
        "The job waits for it."
    )


def test_an_active_plan_named_in_the_spec() -> None:
    client, stub = stubbed()
    stub.add_response("describe_cluster", cluster_response(2), {"ClusterName": "ml-cluster"})
    stub.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [node("i-1", "Running"), node("i-2", "Running")]},
        {"ClusterName": "ml-cluster", "InstanceGroupNameContains": "b200"},
    )
    stub.add_response(
        "describe_training_plan",
        {
            "TrainingPlanArn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/mine",
            "TrainingPlanName": "mine",
            "Status": "Active",
            "EndTime": datetime.datetime(2026, 12, 9, 8, 0, tzinfo=datetime.UTC),
        },
        {"TrainingPlanName": "mine"},
    )
    with stub:
        answer = HyperPodCapacityReader(lambda region: client).read("ml-cluster", B200, 2, "mine")
    assert not answer.short and answer.reason == "Sufficient"
    assert answer.message.endswith(
        "2 of 2 nodes running; 2 needed; training plan mine is Active until 2026-12-09T08:00:00Z."
    )


@pytest.mark.parametrize(
    ("code", "status", "words"),
    [
        ("ThrottlingException", 400, "SageMaker throttled the operator"),
        ("AccessDeniedException", 400, f"needs {', '.join(IAM_ACTIONS)}"),
        ("InternalFailure", 500, "InternalFailure"),
    ],
)
def test_throttling_and_access_denied_degrade_to_unknown_and_are_cached(
    code: str, status: int, words: str
) -> None:
    client, stub = stubbed()
    stub.add_client_error(
        "describe_cluster", service_error_code=code, service_message="no", http_status_code=status
    )
    now = [0.0]
    reader = HyperPodCapacityReader(lambda region: client, ttl=60, clock=lambda: now[0])
    with stub:
        answer = reader.read("ml-cluster", B200, 2)
        # Within the TTL nothing is asked again (the Stubber would refuse an unexpected call).
        again = reader.read("ml-cluster", B200, 2)
    assert not answer.known and not answer.short and answer.reason == "AwsUnknown"
    assert (
        answer.message.startswith(f"HyperPod capacity from AWS unknown: {code}: no.")
        and words in answer.message
    )
    assert again == answer


def test_a_cluster_aws_does_not_know_is_an_answer() -> None:
    client, stub = stubbed()
    stub.add_client_error(
        "describe_cluster",
        service_error_code="ResourceNotFound",
        service_message="Cluster ml-klaster not found",
    )
    with stub:
        answer = HyperPodCapacityReader(lambda region: client).read("ml-klaster", B200, 2)
    assert answer.known and answer.short and answer.reason == "NotFoundInAws"
    assert answer.message.startswith("Cluster ml-klaster not found. Fix: name the HyperPod cluster")


def test_no_credentials_or_region_is_unknown_too() -> None:
    from botocore.exceptions import NoRegionError

    def no_region(region: str | None) -> Any:
        raise NoRegionError()

    answer = HyperPodCapacityReader(no_region).read("ml-cluster", B200, 2)
    assert not answer.known and "NoRegionError" in answer.message


def test_an_arn_names_the_region() -> None:
    regions: list[str | None] = []
    client, stub = stubbed()
    stub.add_client_error("describe_cluster", service_error_code="ThrottlingException")

    def factory(region: str | None) -> Any:
        regions.append(region)
        return client

    with stub:
        HyperPodCapacityReader(factory).read(
            "arn:aws:sagemaker:eu-west-2:123456789012:cluster/abcdef123456", B200, 1
        )
    assert regions == ["eu-west-2"]
    assert split_name("ml-cluster") == ("ml-cluster", None)


def test_the_condition_is_advisory() -> None:
    from blackwell_operator.discovery.aws import AwsCapacity

    nodes_ok = ConditionChange(
        "CapacityAvailable", "True", "Sufficient", "2 of 2 nodes schedulable; 2 needed."
    )
    plan_later = AwsCapacity(True, True, "TrainingPlanNotActive", "training plan p is Scheduled.")
    assert with_aws_capacity(nodes_ok, plan_later) == ConditionChange(
        "CapacityAvailable",
        "False",
        "TrainingPlanNotActive",
        "training plan p is Scheduled. Kubernetes: 2 of 2 nodes schedulable; 2 needed.",
    )
    unknown = AwsCapacity(False, False, "AwsUnknown", "HyperPod capacity from AWS unknown: x.")
    advisory = with_aws_capacity(nodes_ok, unknown)
    assert (advisory.status, advisory.reason) == (nodes_ok.status, nodes_ok.reason)
    assert with_aws_capacity(nodes_ok, None) == nodes_ok


@pytest.mark.integration
async def test_the_operator_reports_aws_capacity(cluster: Cluster, moto_sagemaker: Any) -> None:
    async with running_operator(cluster):
        await cluster.apply(
            btj("p5", cluster={"instanceType": P5, "nodes": 2, "hyperpodCluster": "ml-cluster"})
        )
        await wait_for(lambda: cluster.condition("p5", "CapacityAvailable"), what="CapacityAvailable")
        await wait_for(lambda: cluster.condition("p5", "ChildCreated"), what="the job created all the same")
    capacity = cluster.condition("p5", "CapacityAvailable")
    assert (
        "HyperPod cluster ml-cluster, instance group workers: 4 of 4 nodes running; 2 needed."
        in capacity["message"]
    )
