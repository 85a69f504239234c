# Identity: one IRSA role per workload, each allowed only the bucket key spaces the code uses
# (loraplex.platform.object_keys), plus the platform's own secrets and the role External
# Secrets uses to read them.

locals {
  # One IAM glob per key space of loraplex.platform.object_keys: KeySpace.iam_glob() by name.
  # tests/infra/test_iam_key_prefixes.py keeps these equal to the code's layout.
  key_space_globs = {
    adapters = "tenants/*/adapters/*/*"
    models   = "models/*/*"
  }
  # The root folder of each key space, for a role that lists a whole key space.
  key_space_roots = {
    adapters = "tenants/*"
    models   = "models/*"
  }

  # The S3 actions of reading and of writing objects, and the bucket-level action every
  # writer needs: deleting a prefix first aborts the multipart uploads left under it, which
  # lists them (s3:ListBucketMultipartUploads; without it the abort silently finds nothing).
  # tests/infra/test_iam_actions.py derives what each role's code calls and checks it here.
  read_actions         = ["s3:GetObject"]
  write_actions        = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
  write_bucket_actions = ["s3:ListBucketMultipartUploads"]

  # What each workload does with each key space. api: tenants upload adapters (presigned
  # multipart included) and the gateway reads model assets; worker: validation reads, the
  # deletion and recovery jobs delete, and the orphan reconciler lists every adapter under
  # the tenants root (list_roots); engine: reads weights and adapters, writes nothing;
  # models: `loraplex models add` uploads base models.
  access = {
    api    = { read = ["adapters", "models"], write = ["adapters"], list_roots = [] }
    worker = { read = ["adapters"], write = ["adapters"], list_roots = ["adapters"] }
    engine = { read = ["adapters", "models"], write = [], list_roots = [] }
    models = { read = ["models"], write = ["models"], list_roots = [] }
  }

  # Kubernetes service account of each role (infra/k8s/templates names the same accounts).
  service_accounts = merge(
    { for role in keys(local.access) : role => "loraplex-${role}" },
    { secrets = "loraplex-secrets" },
  )
}

data "aws_iam_policy_document" "s3" {
  for_each = local.access

  statement {
    sid       = "ReadObjects"
    actions   = local.read_actions
    resources = [for s in each.value.read : "${var.bucket_arn}/${local.key_space_globs[s]}"]
  }

  dynamic "statement" {
    for_each = length(each.value.write) > 0 ? [each.value.write] : []
    content {
      sid       = "WriteObjects"
      actions   = local.write_actions
      resources = [for s in statement.value : "${var.bucket_arn}/${local.key_space_globs[s]}"]
    }
  }

  # Uploads in progress are listed on the bucket; the code always names its prefix.
  dynamic "statement" {
    for_each = length(each.value.write) > 0 ? [each.value.write] : []
    content {
      sid       = "ListOwnUploads"
      actions   = local.write_bucket_actions
      resources = [var.bucket_arn]
    }
  }

  # Listing is limited to the same key spaces (and, for the reconciler, the tenants root); a
  # list request without a prefix (the whole bucket's key names) is refused. So a GET or HEAD
  # of a missing key answers 403, not 404: the code never waits for that 404 and looks for
  # every optional file by listing its exact key (loraplex.loader.object_store.ObjectStore.find;
  # tests/platform/test_optional_fetches_list_first.py, tests/infra/test_iam_actions.py).
  statement {
    sid       = "ListOwnKeySpaces"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values = concat(
        [for s in distinct(concat(each.value.read, each.value.write)) : local.key_space_globs[s]],
        [for s in each.value.list_roots : local.key_space_roots[s]],
      )
    }
  }

  statement {
    sid       = "UseBucketKey"
    actions   = length(each.value.write) > 0 ? ["kms:Decrypt", "kms:GenerateDataKey"] : ["kms:Decrypt"]
    resources = [var.bucket_kms_key_arn]
  }
}

resource "aws_iam_policy" "s3" {
  for_each = local.access

  name        = "${var.name}-${each.key}-objects"
  description = "loraplex ${each.key}: its key spaces of the platform bucket"
  policy      = data.aws_iam_policy_document.s3[each.key].json
  tags        = var.tags
}

module "workload_irsa" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source   = "terraform-aws-modules/iam/aws//modules/iam-role-for-service-accounts-eks"
  version  = "5.60.0"
  for_each = local.access

  role_name        = "${var.name}-${each.key}"
  role_policy_arns = { objects = aws_iam_policy.s3[each.key].arn }

  oidc_providers = {
    main = {
      provider_arn               = var.oidc_provider_arn
      namespace_service_accounts = ["${var.namespace}:${local.service_accounts[each.key]}"]
    }
  }

  tags = var.tags
}

# The platform's own secrets: the admin key (the API's operator credential) and the shared
# secret replicas authenticate the gateway with.

module "kms" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/kms/aws"
  version = "3.1.1"

  description             = "${var.name}: platform secrets"
  deletion_window_in_days = 30
  enable_key_rotation     = true
  aliases                 = ["${var.name}-secrets"]

  tags = var.tags
}

resource "random_password" "platform" {
  for_each = toset(["admin-key", "replica-secret"])

  length  = 48
  special = false
}

resource "aws_secretsmanager_secret" "platform" {
  for_each = random_password.platform

  name_prefix = "${var.name}-${each.key}-"
  description = "loraplex ${each.key} (JSON: value); rotate by the runbook in infra/README.md"
  kms_key_id  = module.kms.key_arn
  tags        = var.tags

  #checkov:skip=CKV2_AWS_57:The value is a bearer credential the platform compares at startup; rotation is the runbook in infra/README.md, not a Lambda.
}

resource "aws_secretsmanager_secret_version" "platform" {
  for_each = random_password.platform

  secret_id     = aws_secretsmanager_secret.platform[each.key].id
  secret_string = jsonencode({ value = each.value.result })

  lifecycle {
    # After a manual rotation (runbook) the secret no longer equals the generated value.
    ignore_changes = [secret_string]
  }
}

data "aws_iam_policy_document" "read_secrets" {
  statement {
    sid     = "ReadPlatformSecrets"
    actions = ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
    resources = concat(
      values(var.external_secret_arns),
      [for s in aws_secretsmanager_secret.platform : s.arn],
    )
  }

  statement {
    sid       = "DecryptPlatformSecrets"
    actions   = ["kms:Decrypt"]
    resources = concat(var.external_secret_kms_key_arns, [module.kms.key_arn])
  }
}

resource "aws_iam_policy" "read_secrets" {
  name        = "${var.name}-read-secrets"
  description = "External Secrets (loraplex SecretStore): read the platform's secrets"
  policy      = data.aws_iam_policy_document.read_secrets.json
  tags        = var.tags
}

module "secrets_irsa" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/iam/aws//modules/iam-role-for-service-accounts-eks"
  version = "5.60.0"

  role_name        = "${var.name}-secrets"
  role_policy_arns = { read = aws_iam_policy.read_secrets.arn }

  oidc_providers = {
    main = {
      provider_arn               = var.oidc_provider_arn
      namespace_service_accounts = ["${var.namespace}:${local.service_accounts["secrets"]}"]
    }
  }

  tags = var.tags
}
