locals {
  environment = "dev"
}

module "loraplex" {
  source = "../../stack"

  environment                  = local.environment
  region                       = var.region
  namespace                    = "loraplex"
  vpc_cidr                     = "10.40.0.0/16"
  single_nat_gateway           = true
  kubernetes_version           = "1.34"
  endpoint_public_access_cidrs = var.endpoint_public_access_cidrs
  api_certificate_arn          = var.api_certificate_arn
  api_allowed_cidrs            = var.api_allowed_cidrs

  platform_node_group = {
    instance_types = ["m7i.xlarge"]
    min_size       = 2
    max_size       = 4
    desired_size   = 2
    disk_size_gb   = 50
  }

  # GPU nodes from Karpenter: a NodePool per pool (infra/k8s/templates/karpenter.yaml.j2), spot
  # as the pool says, consolidation of empty or underused nodes, a GPU limit per pool.
  gpu_provisioner = "karpenter"

  gpu_node_groups = {
    # One A10G per node, scaled from zero: the cheapest pool that runs a 7-8B model in bf16.
    # Spot in dev (about a third of the on-demand price; a reclaimed node is a cold start),
    # over two sizes of the same one-GPU machine so a spot shortage of one does not stall it
    # (the autoscaler plans with the first; the second only has more CPU and memory).
    a10g = {
      instance_types = ["g5.2xlarge", "g5.4xlarge"]
      gpus_per_node  = 1
      min_size       = 0
      max_size       = 2
      desired_size   = 0
      capacity_type  = "SPOT"
      disk_size_gb   = 200
    }
  }

  # Verify against `aws eks describe-addon-versions --kubernetes-version 1.34` before applying.
  addon_versions = {
    "coredns"            = "v1.12.3-eksbuild.1"
    "kube-proxy"         = "v1.34.1-eksbuild.2"
    "vpc-cni"            = "v1.20.4-eksbuild.2"
    "aws-ebs-csi-driver" = "v1.54.0-eksbuild.1"
    "aws-efs-csi-driver" = "v2.1.13-eksbuild.1"
  }

  chart_versions = {
    "nvidia-device-plugin"         = "0.16.2"
    "cluster-autoscaler"           = "9.53.0"
    "aws-load-balancer-controller" = "1.13.0"
    "external-secrets"             = "0.17.0"
    "keda"                         = "2.17.0"
    "kube-prometheus-stack"        = "69.4.1"
    "aws-for-fluent-bit"           = "0.1.32"
    "dcgm-exporter"                = "4.1.1"
    "karpenter"                    = "1.5.0"
  }

  database = {
    engine_version         = "16.8"
    instance_class         = "db.t4g.medium"
    allocated_storage_gb   = 20
    multi_az               = false
    deletion_protection    = false
    backup_retention_days  = 3
    password_rotation_days = 30
  }

  cache = {
    engine_version = "7.1"
    node_type      = "cache.t4g.small"
    replicas       = 0
  }

  bucket_name             = var.bucket_name
  noncurrent_version_days = 7
  cors_allowed_origins    = var.cors_allowed_origins

  api_replicas       = { min = 2, max = 4 }
  worker_replicas    = 1
  budget             = { monthly_usd = 2000, emails = var.budget_emails }
  log_retention_days = 14
  prometheus         = { retention_days = 7, storage_gb = 50 }
}
