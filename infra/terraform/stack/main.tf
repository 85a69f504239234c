# The whole platform for one environment: the envs/ roots call this with their sizes.

locals {
  name = "loraplex-${var.environment}"
  tags = { Project = "loraplex", Environment = var.environment, ManagedBy = "terraform" }

  # Each api and worker process keeps one SQLAlchemy pool of 5 + 10 overflow connections
  # (platform/db/session.py); two more pools for a migration Job and an operator's session,
  # and 25 for RDS's own and administrative connections.
  connections_per_pool = 15
  max_connections      = (var.api_replicas.max + var.worker_replicas + 2) * local.connections_per_pool + 25
}

module "network" {
  source = "../modules/network"

  name               = local.name
  cidr               = var.vpc_cidr
  azs                = [for z in ["a", "b", "c"] : "${var.region}${z}"]
  single_nat_gateway = var.single_nat_gateway
  log_retention_days = var.log_retention_days
  tags               = local.tags
}

module "cluster" {
  source = "../modules/cluster"

  name                         = local.name
  kubernetes_version           = var.kubernetes_version
  vpc_id                       = module.network.vpc_id
  private_subnet_ids           = module.network.private_subnet_ids
  endpoint_public_access_cidrs = var.endpoint_public_access_cidrs
  platform_node_group          = var.platform_node_group
  gpu_node_groups              = var.gpu_node_groups
  gpu_provisioner              = var.gpu_provisioner
  addon_versions               = var.addon_versions
  device_plugin_chart_version  = var.chart_versions["nvidia-device-plugin"]
  log_retention_days           = var.log_retention_days
  tags                         = local.tags
}

module "cluster_addons" {
  source = "../modules/cluster_addons"
  # The charts' pods need nodes: without this their Helm releases may be installed (and
  # time out waiting) before any node group has joined.
  depends_on = [module.cluster]

  cluster_name      = module.cluster.cluster_name
  oidc_provider_arn = module.cluster.oidc_provider_arn
  region            = var.region
  vpc_id            = module.network.vpc_id
  chart_versions = {
    for k in ["cluster-autoscaler", "aws-load-balancer-controller", "external-secrets", "keda"] : k => var.chart_versions[k]
  }
  tags = local.tags
}

module "database" {
  source = "../modules/database"

  name                     = local.name
  engine_version           = var.database.engine_version
  instance_class           = var.database.instance_class
  allocated_storage_gb     = var.database.allocated_storage_gb
  multi_az                 = var.database.multi_az
  deletion_protection      = var.database.deletion_protection
  backup_retention_days    = var.database.backup_retention_days
  password_rotation_days   = var.database.password_rotation_days
  max_connections          = local.max_connections
  vpc_id                   = module.network.vpc_id
  subnet_group_name        = module.network.database_subnet_group_name
  client_security_group_id = module.cluster.node_security_group_id
  log_retention_days       = var.log_retention_days
  tags                     = local.tags
}

module "object_storage" {
  source = "../modules/object_storage"

  bucket_name             = var.bucket_name
  noncurrent_version_days = var.noncurrent_version_days
  cors_allowed_origins    = var.cors_allowed_origins
  tags                    = local.tags
}

module "cache" {
  source = "../modules/cache"

  name                     = local.name
  engine_version           = var.cache.engine_version
  node_type                = var.cache.node_type
  replicas                 = var.cache.replicas
  vpc_id                   = module.network.vpc_id
  subnet_group_name        = module.network.elasticache_subnet_group_name
  client_security_group_id = module.cluster.node_security_group_id
  tags                     = local.tags
}

module "identity" {
  source = "../modules/identity"

  name               = local.name
  namespace          = var.namespace
  oidc_provider_arn  = module.cluster.oidc_provider_arn
  bucket_arn         = module.object_storage.bucket_arn
  bucket_kms_key_arn = module.object_storage.kms_key_arn
  external_secret_arns = {
    database = module.database.master_secret_arn
    redis    = module.cache.auth_secret_arn
  }
  external_secret_kms_key_arns = [module.database.kms_key_arn, module.cache.kms_key_arn]
  tags                         = local.tags
}

module "karpenter" {
  source = "../modules/karpenter"
  count  = var.gpu_provisioner == "karpenter" ? 1 : 0
  # Its controller runs on the platform nodes.
  depends_on = [module.cluster]

  cluster_name      = module.cluster.cluster_name
  oidc_provider_arn = module.cluster.oidc_provider_arn
  chart_version     = var.chart_versions["karpenter"]
  tags              = local.tags
}

module "weights_cache" {
  source = "../modules/weights_cache"

  name                     = local.name
  vpc_id                   = module.network.vpc_id
  subnet_ids               = module.network.private_subnet_ids
  client_security_group_id = module.cluster.node_security_group_id
  tags                     = local.tags
}

module "observability" {
  source = "../modules/observability"

  name                      = local.name
  oidc_provider_arn         = module.cluster.oidc_provider_arn
  region                    = var.region
  log_retention_days        = var.log_retention_days
  prometheus_retention_days = var.prometheus.retention_days
  prometheus_storage_gb     = var.prometheus.storage_gb
  chart_versions = {
    for k in ["kube-prometheus-stack", "aws-for-fluent-bit", "dcgm-exporter"] : k => var.chart_versions[k]
  }
  tags = local.tags

  # The storage class needs the EBS CSI add-on, and the dashboards' sidecar the cluster.
  depends_on = [module.cluster]
}

# Container images: the slim platform image (api, worker, migrations) and the CUDA engine
# image (infra/docker). Tags are immutable, so a release's tag always means the same image.
resource "aws_ecr_repository" "images" {
  for_each = toset(["platform", "engine"])

  name                 = "${local.name}/${each.key}"
  image_tag_mutability = "IMMUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
  }

  tags = local.tags
}

resource "aws_ecr_lifecycle_policy" "images" {
  for_each = aws_ecr_repository.images

  repository = each.value.name
  policy = jsonencode({
    rules = [{
      rulePriority = 1
      description  = "Keep the last 50 images (rollbacks reach back that far)"
      selection    = { tagStatus = "any", countType = "imageCountMoreThan", countNumber = 50 }
      action       = { type = "expire" }
    }]
  })
}

# The API certificate's expiry (ACM publishes DaysToExpiry daily; an imported certificate is
# never renewed by ACM, a DNS-validated one is unless its validation record went away).
resource "aws_cloudwatch_metric_alarm" "certificate_expiry" {
  alarm_name          = "${local.name}-api-certificate-expiry"
  alarm_description   = "The API's ACM certificate expires within 30 days."
  namespace           = "AWS/CertificateManager"
  metric_name         = "DaysToExpiry"
  dimensions          = { CertificateArn = var.api_certificate_arn }
  statistic           = "Minimum"
  period              = 86400
  evaluation_periods  = 1
  comparison_operator = "LessThanThreshold"
  threshold           = 30
  treat_missing_data  = "breaching"
  tags                = local.tags
}

# The environment's monthly cost: mail the operators when the forecast passes 80% and when
# the actual cost passes the budget (GPU pools dominate; see infra/README.md's cost tables).
resource "aws_budgets_budget" "monthly" {
  name         = "${local.name}-monthly"
  budget_type  = "COST"
  limit_amount = tostring(var.budget.monthly_usd)
  limit_unit   = "USD"
  time_unit    = "MONTHLY"

  cost_filter {
    name   = "TagKeyValue"
    values = ["user:Environment$${var.environment}"]
  }

  notification {
    comparison_operator        = "GREATER_THAN"
    threshold                  = 80
    threshold_type             = "PERCENTAGE"
    notification_type          = "FORECASTED"
    subscriber_email_addresses = var.budget.emails
  }

  notification {
    comparison_operator        = "GREATER_THAN"
    threshold                  = 100
    threshold_type             = "PERCENTAGE"
    notification_type          = "ACTUAL"
    subscriber_email_addresses = var.budget.emails
  }
}
