"""S3 and STS answers no restart can change (AccessDenied, NoSuchBucket), as one line naming the fix.

The trainer's pods restart on failure; a missing permission or bucket fails the same way on every
restart, so such an error ends the job once (a `permanent error:` termination message, which the
operator turns into phase Failed) with the permission or bucket named. Throttling, 5xx answers and lost
connections stay retryable (boto3 retries them, then the pod's restart does). docs/install.md lists
every permission the trainer and the operator use.
"""

from __future__ import annotations

from typing import Any

# The IAM action each S3/STS operation the trainer calls needs (docs/install.md §3).
PERMISSION_OF = {
    "ListObjectsV2": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject",
    "AssumeRoleWithWebIdentity": "sts:AssumeRoleWithWebIdentity",
}
# Error codes that say the caller may not do this (HEAD answers carry only the status, "403").
_DENIED = {
    "AccessDenied",
    "403",
    "AllAccessDisabled",
    "AccountProblem",
    "AccessDeniedException",
}
# Credentials AWS does not accept (a key of another account, a bad web identity token).
_BAD_CREDENTIALS = {
    "InvalidAccessKeyId",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "InvalidIdentityToken",
}
_NO_BUCKET = {"NoSuchBucket", "InvalidBucketName"}
# botocore's exceptions for a pod with no credentials at all (no role on its ServiceAccount).
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError"}


class PermanentCloudError(RuntimeError):
    """An S3/STS refusal no retry can change; the message names the field, permission or bucket, and fix."""


def _bucket_and_key(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def permanent(err: BaseException, field: str, uri: str) -> PermanentCloudError | None:
    """The permanent error `err` is, raised while `field` (dataset.uri, ...) read or wrote `uri`; None
    when a retry may help (throttling, a server error, a lost connection, a key gone since the listing)."""
    if type(err).__name__ in _NO_CREDENTIALS:
        return PermanentCloudError(
            f"{field} {uri}: the pod has no AWS credentials. Fix: set spec.serviceAccountName to a "
            "ServiceAccount with an IAM role (EKS Pod Identity or IRSA, docs/install.md §3)"
        )
    response: Any = getattr(err, "response", None)
    if not isinstance(response, dict):
        # boto3's transfers wrap the ClientError (S3UploadFailedError): judge the one underneath.
        inner = err.__cause__ or err.__context__
        return permanent(inner, field, uri) if inner is not None and inner is not err else None
    code = str((response.get("Error") or {}).get("Code", ""))
    operation = str(getattr(err, "operation_name", "") or "")
    bucket, key = _bucket_and_key(uri)
    if code in _NO_BUCKET:
        return PermanentCloudError(
            f"{field} {uri}: bucket {bucket!r} does not exist ({code} on {operation}). Fix: create it, or "
            f"correct {field} (the bucket name, in the cluster's account and region)"
        )
    if code in _BAD_CREDENTIALS:
        return PermanentCloudError(
            f"{field} {uri}: AWS does not accept the pod's credentials ({code} on {operation}). Fix: give "
            "spec.serviceAccountName an IAM role of this account (EKS Pod Identity or IRSA, docs/install.md "
            "§3) instead of static keys"
        )
    if code in _DENIED:
        action = PERMISSION_OF.get(operation, f"the permission of {operation}")
        resource = f"arn:aws:s3:::{bucket}" if action == "s3:ListBucket" else f"arn:aws:s3:::{bucket}/{key}"
        if action.startswith("sts:"):
            return PermanentCloudError(
                f"{field} {uri}: the pod's role cannot be assumed ({code} on {operation}). Fix: allow "
                f"{action} in the role's trust policy for the ServiceAccount (docs/install.md §3)"
            )
        return PermanentCloudError(
            f"{field} {uri}: {code} on {operation}: the pod's role lacks {action} on {resource}. Fix: "
            f"grant {action} on {resource} to the IAM role of spec.serviceAccountName (docs/install.md §3)"
        )
    return None


def raise_if_permanent(err: BaseException, field: str, uri: str) -> None:
    """Raise the PermanentCloudError `err` is (from it); return when a retry may help."""
    found = permanent(err, field, uri)
    if found is not None:
        raise found from err
