"""HyperPod capacity from AWS: the cluster's instance groups, running nodes and the training plan (advisory).

Three read-only SageMaker calls, with the operator's IRSA or EKS Pod Identity role: DescribeCluster
(instance groups of the job's instance type, their target counts and training plan), ListClusterNodes
(how many of their nodes are Running) and DescribeTrainingPlan (status and time window of the Flexible
Training Plan that books the capacity). Results are remembered for a minute, so a burst of BTJs does not
run into SageMaker's throttling; any AWS error (throttling, access denied, no credentials, no network)
makes the answer "unknown", never a failed reconcile.
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from blackwell_operator.timefmt import format_rfc3339

# The IAM actions these reads need; the chart's NOTES and docs/backends.md print the policy.
IAM_ACTIONS = ("sagemaker:DescribeCluster", "sagemaker:ListClusterNodes", "sagemaker:DescribeTrainingPlan")
DEFAULT_TTL_S = 60.0
_ARN = re.compile(r"^arn:[^:]+:sagemaker:(?P<region>[^:]+):[^:]*:(?P<kind>[a-z-]+)/(?P<name>.+)$")
_ACCESS_DENIED = ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation")

# region (None: the operator's default) -> a boto3 SageMaker client.
ClientFactory = Callable[[str | None], Any]


@dataclass(frozen=True)
class TrainingPlan:
    """A Flexible Training Plan as DescribeTrainingPlan returns it."""

    name: str
    status: str  # Pending, Active, Scheduled, Expired, Failed
    start: str
    end: str


@dataclass(frozen=True)
class GroupFacts:
    """What AWS says about the job's instance type in one HyperPod cluster."""

    cluster: str
    instance_type: str
    groups: tuple[str, ...]  # instance groups of that type
    other_groups: tuple[str, ...]  # the cluster's other groups, as name (type)
    running: int
    target: int
    plan: TrainingPlan | None


@dataclass(frozen=True)
class AwsCapacity:
    """The answer for one BTJ: known or not, whether it says the job cannot start now, and why."""

    known: bool
    short: bool
    reason: str
    message: str


def split_name(name_or_arn: str) -> tuple[str, str | None]:
    """(name, region) of a SageMaker resource given by name (region None) or by ARN."""
    match = _ARN.match(name_or_arn)
    if match is None:
        return name_or_arn, None
    return match["name"], match["region"]


def _time(value: Any) -> str:
    """An AWS timestamp (datetime) as RFC 3339, UTC."""
    if isinstance(value, datetime.datetime):
        return format_rfc3339(value)
    return str(value or "?")


def _nodes(client: Any, cluster: str, group: str) -> Iterator[dict[str, Any]]:
    """Every node of one instance group (ListClusterNodes is paginated)."""
    kwargs: dict[str, Any] = {"ClusterName": cluster, "InstanceGroupNameContains": group}
    while True:
        page = client.list_cluster_nodes(**kwargs)
        for node in page.get("ClusterNodeSummaries") or []:
            if node.get("InstanceGroupName") == group:  # "Contains" also matches longer names
                yield node
        token = page.get("NextToken")
        if not token:
            return
        kwargs["NextToken"] = token


def read_facts(client: Any, cluster: str, instance_type: str, plan_name: str | None) -> GroupFacts:
    """DescribeCluster, then ListClusterNodes of the groups of the type and DescribeTrainingPlan."""
    described = client.describe_cluster(ClusterName=cluster)
    groups = [g for g in described.get("InstanceGroups") or [] if g.get("InstanceType") == instance_type]
    others = tuple(
        f"{g.get('InstanceGroupName')} ({g.get('InstanceType')})"
        for g in described.get("InstanceGroups") or []
        if g.get("InstanceType") != instance_type
    )
    running = sum(
        1
        for g in groups
        for node in _nodes(client, cluster, str(g["InstanceGroupName"]))
        if (node.get("InstanceStatus") or {}).get("Status") == "Running"
    )
    target = sum(int(g.get("TargetCount") or 0) for g in groups)
    if plan_name is None:
        plan_name = next(
            (split_name(str(g["TrainingPlanArn"]))[0] for g in groups if g.get("TrainingPlanArn")), None
        )
    plan = None
    if plan_name is not None:
        answer = client.describe_training_plan(TrainingPlanName=plan_name)
        plan = TrainingPlan(
            name=str(answer.get("TrainingPlanName") or plan_name),
            status=str(answer.get("Status") or "?"),
            start=_time(answer.get("StartTime")),
            end=_time(answer.get("EndTime")),
        )
    return GroupFacts(
        cluster=str(described.get("ClusterName") or cluster),
        instance_type=instance_type,
        groups=tuple(str(g["InstanceGroupName"]) for g in groups),
        other_groups=others,
        running=running,
        target=target,
        plan=plan,
    )


def judge(facts: GroupFacts, needed: int) -> AwsCapacity:
    """The capacity answer from what AWS said, for a job of `needed` nodes."""
    where = f"HyperPod cluster {facts.cluster}"
    if not facts.groups:
        others = ", ".join(facts.other_groups) or "none"
        return AwsCapacity(
            True,
            True,
            "NoInstanceGroup",
            f"{where} has no instance group of {facts.instance_type} (its groups: {others}).",
        )
    groups = ", ".join(facts.groups)
    text = (
        f"{where}, instance group {groups}: {facts.running} of {facts.target} nodes running; {needed} needed"
    )
    plan = facts.plan
    if plan is not None:
        if plan.status == "Active":
            text += f"; training plan {plan.name} is Active until {plan.end}"
        elif plan.status in ("Pending", "Scheduled"):
            return AwsCapacity(
                True,
                True,
                "TrainingPlanNotActive",
                f"{text}; training plan {plan.name} is {plan.status}: it starts at {plan.start} and ends at "
                f"{plan.end}. The job waits for it.",
            )
        else:  # Expired, Failed
            return AwsCapacity(
                True,
                True,
                "TrainingPlanNotActive",
                f"{text}; training plan {plan.name} is {plan.status} (it ended at {plan.end}). Fix: book a "
                "new Flexible Training Plan or name another in spec.cluster.trainingPlan",
            )
    if facts.running < needed:
        return AwsCapacity(True, True, "InstanceGroupShort", f"{text}.")
    return AwsCapacity(True, False, "Sufficient", f"{text}.")


def unknown(error: Exception) -> AwsCapacity:
    """The answer when AWS could not be read (the reason in words; the job goes on), or said not found."""
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code") or "ClientError")
        detail = str(error.response.get("Error", {}).get("Message") or "")
        if code == "ResourceNotFound":  # a misnamed cluster or plan: that is an answer, not an outage
            return AwsCapacity(
                True,
                True,
                "NotFoundInAws",
                f"{detail or 'Not found in AWS'}. Fix: name the HyperPod cluster and training plan as `aws "
                "sagemaker list-clusters` and `list-training-plans` show them, in the operator's region (or "
                "give an ARN)",
            )
        if code in _ACCESS_DENIED:
            hint = f" The operator's AWS role needs {', '.join(IAM_ACTIONS)} (docs/backends.md)."
        elif code in ("ThrottlingException", "Throttling", "TooManyRequestsException"):
            hint = " SageMaker throttled the operator; it asks again within a few minutes."
        else:
            hint = ""
        return AwsCapacity(
            False, False, "AwsUnknown", f"HyperPod capacity from AWS unknown: {code}: {detail}.{hint}"
        )
    return AwsCapacity(
        False, False, "AwsUnknown", f"HyperPod capacity from AWS unknown: {type(error).__name__}: {error}."
    )


class HyperPodCapacityReader:
    """Reads and caches AWS capacity per (cluster, instance type, plan); errors are cached too, so that a
    throttled or unauthorised operator does not call again for every BTJ."""

    def __init__(
        self,
        client_factory: ClientFactory,
        *,
        ttl: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = client_factory
        self._ttl = ttl
        self._clock = clock
        self._clients: dict[str | None, Any] = {}
        self._cache: dict[tuple[str, str, str | None], tuple[float, GroupFacts | Exception]] = {}
        self._lock = threading.Lock()

    def _client(self, region: str | None) -> Any:
        with self._lock:
            if region not in self._clients:
                self._clients[region] = self._factory(region)
            return self._clients[region]

    def read(self, cluster: str, instance_type: str, needed: int, plan: str | None = None) -> AwsCapacity:
        """Capacity for a job of `needed` nodes of `instance_type` in `cluster` (name or ARN)."""
        key = (cluster, instance_type, plan)
        with self._lock:
            cached = self._cache.get(key)
        if cached is None or self._clock() - cached[0] >= self._ttl:
            name, region = split_name(cluster)
            plan_name = split_name(plan)[0] if plan else None
            try:
                found: GroupFacts | Exception = read_facts(
                    self._client(region), name, instance_type, plan_name
                )
            except (ClientError, BotoCoreError) as exc:
                found = exc
            cached = (self._clock(), found)
            with self._lock:
                self._cache[key] = cached
        result = cached[1]
        return unknown(result) if isinstance(result, Exception) else judge(result, needed)


def boto3_client_factory() -> ClientFactory:
    """SageMaker clients from the operator's AWS credentials (IRSA, Pod Identity, environment), with short
    timeouts and botocore's standard retry mode (it backs off on throttling, two attempts)."""

    def make(region: str | None) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2, "mode": "standard"})
        return boto3.client("sagemaker", region_name=region, config=config)

    return make
