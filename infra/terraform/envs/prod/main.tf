locals {
  environment = "prod"
}

module "loraplex" {
  source = "../../stack"

  environment                  = local.environment
  region                       = var.region
  namespace                    = "loraplex"
  vpc_cidr                     = "10.50.0.0/16"
  single_nat_gateway           = false
  kubernetes_version           = "1.34"
  endpoint_public_access_cidrs = var.endpoint_public_access_cidrs
  api_certificate_arn          = var.api_certificate_arn
  api_allowed_cidrs            = var.api_allowed_cidrs

  platform_node_group = {
    instance_types = ["m7i.2xlarge"]
    min_size       = 3
    max_size       = 8
    desired_size   = 3
    disk_size_gb   = 100
  }

  # GPU nodes from managed node groups (capacity blocks and the on-demand H100 quota need
  # them); "karpenter" is the other choice (dev uses it).
  gpu_provisioner = "node_groups"

  gpu_node_groups = {
    # 8 x H100 per node: one engine pod per GPU, or one expert-parallel pod over all 8.
    # GPU capacity is explicit: a new account's quota for P instances ("Running On-Demand P
    # instances", in vCPUs; a p5.48xlarge is 192) is 0, so this pool starts at zero nodes and
    # a first apply succeeds without it. Raise the quota (Service Quotas, L-417A185B) to
    # 192 x max_size, then raise min_size/desired_size; or buy a capacity block and set
    # capacity_type = "CAPACITY_BLOCK" with its capacity_reservation_id = "cr-...".
    h100 = {
      instance_types = ["p5.48xlarge"]
      gpus_per_node  = 8
      min_size       = 0
      max_size       = 4
      desired_size   = 0
      capacity_type  = "ON_DEMAND"
      disk_size_gb   = 500
    }
    # 1 x L40S per node for small dense models and overflow.
    l40s = {
      instance_types = ["g6e.2xlarge"]
      gpus_per_node  = 1
      min_size       = 0
      max_size       = 8
      desired_size   = 0
      capacity_type  = "ON_DEMAND"
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
    instance_class         = "db.r7g.large"
    allocated_storage_gb   = 100
    multi_az               = true
    deletion_protection    = true
    backup_retention_days  = 14
    password_rotation_days = 90
  }

  cache = {
    engine_version = "7.1"
    node_type      = "cache.r7g.large"
    replicas       = 1
  }

  bucket_name             = var.bucket_name
  noncurrent_version_days = 30
  cors_allowed_origins    = var.cors_allowed_origins

  api_replicas       = { min = 3, max = 12 }
  worker_replicas    = 3
  budget             = { monthly_usd = 60000, emails = var.budget_emails }
  log_retention_days = 90
  prometheus         = { retention_days = 30, storage_gb = 200 }
}
