# Karpenter for the GPU nodes (var.gpu_provisioner = "karpenter" in the stack): its controller
# role (IRSA), the role of the nodes it launches (with an EKS access entry), the interruption
# queue (spot reclaims and rebalance notices drain a node before AWS takes it), and the
# controller itself on the platform nodes. The NodePools and the EC2NodeClass are rendered with
# the other manifests (infra/k8s/templates/karpenter.yaml.j2), one NodePool per GPU pool.

module "karpenter" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/eks/aws//modules/karpenter"
  version = "20.37.1"

  cluster_name          = var.cluster_name
  enable_v1_permissions = true

  # IRSA, like every other controller here (no Pod Identity agent in the cluster).
  enable_irsa                     = true
  irsa_oidc_provider_arn          = var.oidc_provider_arn
  irsa_namespace_service_accounts = ["kube-system:karpenter"]
  create_pod_identity_association = false

  node_iam_role_use_name_prefix = false
  node_iam_role_name            = "${var.cluster_name}-karpenter-node"
  node_iam_role_additional_policies = {
    ssm = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
  }

  tags = var.tags
}

resource "helm_release" "karpenter" {
  name       = "karpenter"
  repository = "oci://public.ecr.aws/karpenter"
  chart      = "karpenter"
  version    = var.chart_version
  namespace  = "kube-system"

  values = [yamlencode({
    # Never on a node it manages: a consolidation could remove its own node.
    nodeSelector = { "loraplex.dev/pool" = "platform" }
    serviceAccount = {
      name        = "karpenter"
      annotations = { "eks.amazonaws.com/role-arn" = module.karpenter.iam_role_arn }
    }
    settings = {
      clusterName       = var.cluster_name
      interruptionQueue = module.karpenter.queue_name
    }
    controller = {
      resources = {
        requests = { cpu = "250m", memory = "512Mi" }
        limits   = { cpu = "1", memory = "1Gi" }
      }
    }
  })]
}
