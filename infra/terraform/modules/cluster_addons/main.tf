# Cluster add-ons the workloads rely on: Cluster Autoscaler (GPU pools scale from zero),
# the AWS Load Balancer Controller (the API's ALB), External Secrets (Secrets Manager ->
# Kubernetes Secrets) and KEDA (engine replicas scale on queue depth).

module "cluster_autoscaler_irsa" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/iam/aws//modules/iam-role-for-service-accounts-eks"
  version = "5.60.0"

  role_name                        = "${var.cluster_name}-cluster-autoscaler"
  attach_cluster_autoscaler_policy = true
  cluster_autoscaler_cluster_names = [var.cluster_name]

  oidc_providers = {
    main = {
      provider_arn               = var.oidc_provider_arn
      namespace_service_accounts = ["kube-system:cluster-autoscaler"]
    }
  }

  tags = var.tags
}

module "load_balancer_controller_irsa" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/iam/aws//modules/iam-role-for-service-accounts-eks"
  version = "5.60.0"

  role_name                              = "${var.cluster_name}-lb-controller"
  attach_load_balancer_controller_policy = true

  oidc_providers = {
    main = {
      provider_arn               = var.oidc_provider_arn
      namespace_service_accounts = ["kube-system:aws-load-balancer-controller"]
    }
  }

  tags = var.tags
}

resource "helm_release" "cluster_autoscaler" {
  name       = "cluster-autoscaler"
  repository = "https://kubernetes.github.io/autoscaler"
  chart      = "cluster-autoscaler"
  version    = var.chart_versions["cluster-autoscaler"]
  namespace  = "kube-system"

  values = [yamlencode({
    awsRegion     = var.region
    autoDiscovery = { clusterName = var.cluster_name }
    rbac = {
      serviceAccount = {
        name        = "cluster-autoscaler"
        annotations = { "eks.amazonaws.com/role-arn" = module.cluster_autoscaler_irsa.iam_role_arn }
      }
    }
    extraArgs = {
      # GPU nodes are expensive: give an idle one back after 10 minutes.
      "scale-down-unneeded-time" = "10m"
      # Consolidate: a node whose pods use under half of it is drained onto the others.
      "scale-down-utilization-threshold" = "0.5"
      "skip-nodes-with-local-storage"    = "false"
      "balance-similar-node-groups"      = "true"
      "expander"                         = "least-waste"
    }
    nodeSelector = { "loraplex.dev/pool" = "platform" }
  })]
}

resource "helm_release" "load_balancer_controller" {
  name       = "aws-load-balancer-controller"
  repository = "https://aws.github.io/eks-charts"
  chart      = "aws-load-balancer-controller"
  version    = var.chart_versions["aws-load-balancer-controller"]
  namespace  = "kube-system"

  values = [yamlencode({
    clusterName = var.cluster_name
    region      = var.region
    vpcId       = var.vpc_id
    serviceAccount = {
      name        = "aws-load-balancer-controller"
      annotations = { "eks.amazonaws.com/role-arn" = module.load_balancer_controller_irsa.iam_role_arn }
    }
    nodeSelector = { "loraplex.dev/pool" = "platform" }
  })]
}

resource "helm_release" "external_secrets" {
  name             = "external-secrets"
  repository       = "https://charts.external-secrets.io"
  chart            = "external-secrets"
  version          = var.chart_versions["external-secrets"]
  namespace        = "external-secrets"
  create_namespace = true

  # The controller holds no AWS permission: each namespace's SecretStore authenticates with
  # its own IRSA service account (see the identity module's secrets_reader role).
  values = [yamlencode({
    installCRDs  = true
    nodeSelector = { "loraplex.dev/pool" = "platform" }
  })]
}

resource "helm_release" "keda" {
  name             = "keda"
  repository       = "https://kedacore.github.io/charts"
  chart            = "keda"
  version          = var.chart_versions["keda"]
  namespace        = "keda"
  create_namespace = true

  values = [yamlencode({
    nodeSelector = { "loraplex.dev/pool" = "platform" }
  })]
}
