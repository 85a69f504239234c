# Observability: container logs to a KMS-encrypted CloudWatch log group with retention
# (Fluent Bit), and Prometheus + Grafana (kube-prometheus-stack) with the loraplex
# dashboards, kept as JSON beside this file and loaded by Grafana's dashboard sidecar.

locals {
  namespace  = "monitoring"
  log_group  = "/loraplex/${var.name}/containers"
  dashboards = fileset("${path.module}/dashboards", "*.json")
}

data "aws_caller_identity" "current" {}

data "aws_iam_policy_document" "logs_key" {
  statement {
    sid       = "CloudWatchLogsUseTheKey"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${var.region}.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:aws:logs:${var.region}:${data.aws_caller_identity.current.account_id}:log-group:${local.log_group}"]
    }
  }
}

module "kms" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/kms/aws"
  version = "3.1.1"

  description             = "${var.name}: container logs"
  deletion_window_in_days = 30
  enable_key_rotation     = true
  aliases                 = ["${var.name}-logs"]
  source_policy_documents = [data.aws_iam_policy_document.logs_key.json]

  tags = var.tags
}

resource "aws_cloudwatch_log_group" "containers" {
  #checkov:skip=CKV_AWS_338:Retention is chosen per environment (log_retention_days: dev 14, prod 90); container logs are high-volume and the audit trail lives in the database.
  name              = local.log_group
  retention_in_days = var.log_retention_days
  kms_key_id        = module.kms.key_arn
  tags              = var.tags
}

data "aws_iam_policy_document" "fluent_bit" {
  statement {
    sid       = "ShipContainerLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
    resources = ["${aws_cloudwatch_log_group.containers.arn}:*"]
  }
}

resource "aws_iam_policy" "fluent_bit" {
  name        = "${var.name}-fluent-bit"
  description = "Fluent Bit: write container logs to ${local.log_group}"
  policy      = data.aws_iam_policy_document.fluent_bit.json
  tags        = var.tags
}

module "fluent_bit_irsa" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/iam/aws//modules/iam-role-for-service-accounts-eks"
  version = "5.60.0"

  role_name        = "${var.name}-fluent-bit"
  role_policy_arns = { logs = aws_iam_policy.fluent_bit.arn }

  oidc_providers = {
    main = {
      provider_arn               = var.oidc_provider_arn
      namespace_service_accounts = ["${local.namespace}:fluent-bit"]
    }
  }

  tags = var.tags
}

resource "kubernetes_namespace_v1" "monitoring" {
  metadata {
    name = local.namespace
  }
}

resource "helm_release" "fluent_bit" {
  name       = "fluent-bit"
  repository = "https://aws.github.io/eks-charts"
  chart      = "aws-for-fluent-bit"
  version    = var.chart_versions["aws-for-fluent-bit"]
  namespace  = kubernetes_namespace_v1.monitoring.metadata[0].name

  values = [yamlencode({
    serviceAccount = {
      name        = "fluent-bit"
      annotations = { "eks.amazonaws.com/role-arn" = module.fluent_bit_irsa.iam_role_arn }
    }
    cloudWatchLogs = {
      enabled         = true
      region          = var.region
      logGroupName    = aws_cloudwatch_log_group.containers.name
      autoCreateGroup = false
    }
    firehose      = { enabled = false }
    kinesis       = { enabled = false }
    elasticsearch = { enabled = false }
    tolerations   = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
  })]
}

resource "random_password" "grafana_admin" {
  length  = 32
  special = false
}

resource "kubernetes_secret_v1" "grafana_admin" {
  metadata {
    name      = "grafana-admin"
    namespace = kubernetes_namespace_v1.monitoring.metadata[0].name
  }

  data = {
    admin-user     = "admin"
    admin-password = random_password.grafana_admin.result
  }
}

resource "kubernetes_config_map_v1" "dashboards" {
  for_each = local.dashboards

  metadata {
    name      = "loraplex-dashboard-${trimsuffix(each.value, ".json")}"
    namespace = kubernetes_namespace_v1.monitoring.metadata[0].name
    labels    = { grafana_dashboard = "1" }
  }

  data = {
    (each.value) = file("${path.module}/dashboards/${each.value}")
  }
}

resource "helm_release" "kube_prometheus_stack" {
  name       = "kube-prometheus-stack"
  repository = "https://prometheus-community.github.io/helm-charts"
  chart      = "kube-prometheus-stack"
  version    = var.chart_versions["kube-prometheus-stack"]
  namespace  = kubernetes_namespace_v1.monitoring.metadata[0].name

  values = [yamlencode({
    prometheus = {
      prometheusSpec = {
        retention = "${var.prometheus_retention_days}d"
        # Pick up the PodMonitors in the loraplex namespace (infra/k8s), not only the chart's.
        podMonitorSelectorNilUsesHelmValues     = false
        serviceMonitorSelectorNilUsesHelmValues = false
        nodeSelector                            = { "loraplex.dev/pool" = "platform" }
        storageSpec = {
          volumeClaimTemplate = {
            spec = {
              storageClassName = "gp3"
              accessModes      = ["ReadWriteOnce"]
              resources        = { requests = { storage = "${var.prometheus_storage_gb}Gi" } }
            }
          }
        }
      }
    }
    grafana = {
      admin = { existingSecret = kubernetes_secret_v1.grafana_admin.metadata[0].name }
      sidecar = {
        dashboards = { enabled = true, label = "grafana_dashboard", searchNamespace = "ALL" }
      }
      nodeSelector = { "loraplex.dev/pool" = "platform" }
    }
    alertmanager = { alertmanagerSpec = { nodeSelector = { "loraplex.dev/pool" = "platform" } } }
  })]

  depends_on = [kubernetes_storage_class_v1.gp3]
}

resource "kubernetes_storage_class_v1" "gp3" {
  metadata {
    name = "gp3"
  }

  storage_provisioner    = "ebs.csi.aws.com"
  reclaim_policy         = "Retain"
  volume_binding_mode    = "WaitForFirstConsumer"
  allow_volume_expansion = true

  parameters = {
    type      = "gp3"
    encrypted = "true"
  }
}

# GPU telemetry: NVIDIA's DCGM exporter on every GPU node (utilization, memory, power,
# temperature, XID errors), scraped by Prometheus through the chart's ServiceMonitor and
# plotted on the "loraplex serving" dashboard.
resource "helm_release" "dcgm_exporter" {
  name       = "dcgm-exporter"
  repository = "https://nvidia.github.io/dcgm-exporter/helm-charts"
  chart      = "dcgm-exporter"
  version    = var.chart_versions["dcgm-exporter"]
  namespace  = kubernetes_namespace_v1.monitoring.metadata[0].name

  values = [yamlencode({
    serviceMonitor = { enabled = true, interval = "15s" }
    nodeSelector   = { "loraplex.dev/pool" = "gpu" }
    tolerations    = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
  })]

  depends_on = [helm_release.kube_prometheus_stack]
}
